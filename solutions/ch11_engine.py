"""Chapter 11 exercises: reference solutions."""


def nucleus(probs: list[float], top_p: float) -> set[int]:
    """Exercise 11.1: keep a token while the mass ranked before it is below top_p."""
    kept, mass = set(), 0.0
    for token in sorted(range(len(probs)), key=lambda t: -probs[t]):
        if kept and mass >= top_p:
            break
        kept.add(token)
        mass += probs[token]
    return kept


def decode_roofline_tokens_per_s(weight_bytes: float, kv_bytes_per_token: float, batch: int,
                                 mean_context: float, bandwidth: float) -> float:
    """Exercise 11.2: batch tokens per (weights + KV) / bandwidth seconds."""
    step = (weight_bytes + batch * mean_context * kv_bytes_per_token) / bandwidth
    return batch / step


def ttft_and_tpot(arrival: float, token_times: list[float]) -> tuple[float, float | None]:
    """Exercise 11.3: first-token latency and the mean gap after it."""
    ttft = token_times[0] - arrival
    if len(token_times) < 2:
        return ttft, None
    return ttft, (token_times[-1] - token_times[0]) / (len(token_times) - 1)
