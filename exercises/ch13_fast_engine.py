"""Chapter 13 exercises: fusing the decode step.

Replace each `raise NotImplementedError(...)` with your answer, then run `make check-exercises`.
"""

import torch

import minipaged  # noqa: F401  (before triton: the interpreter switch on a CPU)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Exercise 13.1: RMSNorm of every row of ``x [N, H]`` (any H) by a Triton kernel."""
    raise NotImplementedError("Exercise 13.1: write a Triton kernel with one program per row "
                              "(edit exercises/ch13_fast_engine.py, rms_norm)")


def next_to_fuse(profile: dict) -> str:
    """Exercise 13.2: the part of a decode step whose removal saves the most time."""
    raise NotImplementedError("Exercise 13.2: return 'host' or a class name "
                              "(edit exercises/ch13_fast_engine.py, next_to_fuse)")


def makespan(loads: list[int], slots: int) -> int:
    """Exercise 13.3: when the last program finishes, in tokens walked.

    Programs start in the order of ``loads`` (tokens each walks), each on the slot that is
    free first; ``slots`` programs run at once.
    """
    raise NotImplementedError("Exercise 13.3: simulate the slots taking programs in order "
                              "(edit exercises/ch13_fast_engine.py, makespan)")
