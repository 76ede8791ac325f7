"""Chapter 11 exercises: the engine.

Replace each `raise NotImplementedError(...)` with your answer, then run `make check-exercises`.
"""


def nucleus(probs: list[float], top_p: float) -> set[int]:
    """Exercise 11.1: the token ids top-p sampling keeps (mass ranked before a token < top_p)."""
    raise NotImplementedError("Exercise 11.1: sort by probability and keep tokens while the mass "
                              "before them is below top_p (edit exercises/ch11_engine.py, nucleus)")


def decode_roofline_tokens_per_s(weight_bytes: float, kv_bytes_per_token: float, batch: int,
                                 mean_context: float, bandwidth: float) -> float:
    """Exercise 11.2: output tokens/s if a decode step only reads weights once plus the batch's KV."""
    raise NotImplementedError("Exercise 11.2: bytes per step over bandwidth, batch tokens per step "
                              "(edit exercises/ch11_engine.py, decode_roofline_tokens_per_s)")


def ttft_and_tpot(arrival: float, token_times: list[float]) -> tuple[float, float | None]:
    """Exercise 11.3: (time to first token, mean time per output token after the first or None)."""
    raise NotImplementedError("Exercise 11.3: first token minus arrival; mean gap between tokens "
                              "(edit exercises/ch11_engine.py, ttft_and_tpot)")
