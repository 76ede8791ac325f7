"""Chapter 11 exercises: the engine.

Replace each `raise NotImplementedError(...)` with your answer, then run `make check-exercises`.
"""

import torch

from minipaged.engine.sampler import Sampler


def nucleus(probs: list[float], top_p: float) -> set[int]:
    """Exercise 11.1: the token ids top-p sampling keeps (the rule ``sample`` uses)."""
    raise NotImplementedError("Exercise 11.1: return the set of token ids top-p keeps "
                              "(edit exercises/ch11_engine.py, nucleus)")


def decode_roofline_tokens_per_s(weight_bytes: float, kv_bytes_per_token: float, batch: int,
                                 mean_context: float, bandwidth: float) -> float:
    """Exercise 11.2: output tokens/s if a decode step only reads weights once plus the KV."""
    raise NotImplementedError("Exercise 11.2: return the roofline's output tokens per second "
                              "(edit exercises/ch11_engine.py, decode_roofline_tokens_per_s)")


def ttft_and_tpot(arrival: float, token_times: list[float]) -> tuple[float, float | None]:
    """Exercise 11.3: (time to first token, time per output token or None)."""
    raise NotImplementedError("Exercise 11.3: return the two latencies of one request "
                              "(edit exercises/ch11_engine.py, ttft_and_tpot)")


def apply_repetition_penalty(logits: torch.Tensor, histories: list[list[int]],
                             penalty: float) -> torch.Tensor:
    """Exercise 11.4: ``logits [B, V]`` with each row's history penalised (a new tensor)."""
    raise NotImplementedError("Exercise 11.4: return the penalised logits "
                              "(edit exercises/ch11_engine.py, apply_repetition_penalty)")


class PenalizedSampler(Sampler):
    """Exercise 11.4: chapter 11's sampling part, with a repetition penalty applied before
    every draw."""

    def __init__(self, device, repetition_penalty: float = 1.0) -> None:
        raise NotImplementedError("Exercise 11.4: build a sampler that penalises repeats "
                                  "(edit exercises/ch11_engine.py, PenalizedSampler)")
