"""Chapter 12 exercises: the engine.

Replace each `raise NotImplementedError(...)` with your answer, then run `make check-exercises`.
"""

import torch

from minipaged.engine.sampler import Sampler


def apply_repetition_penalty(logits: torch.Tensor, histories: list[list[int]],
                             penalty: float) -> torch.Tensor:
    """Exercise 12.1: ``logits [B, V]`` with each row's history penalised (a new tensor)."""
    raise NotImplementedError("Exercise 12.1: return the penalised logits "
                              "(edit exercises/ch12_engine.py, apply_repetition_penalty)")


class PenalizedSampler(Sampler):
    """Exercise 12.1: chapter 11's sampling part, with a repetition penalty applied before
    every draw."""

    def __init__(self, device, repetition_penalty: float = 1.0) -> None:
        raise NotImplementedError("Exercise 12.1: build a sampler that penalises repeats "
                                  "(edit exercises/ch12_engine.py, PenalizedSampler)")
