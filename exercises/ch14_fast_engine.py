"""Chapter 14 exercises: fusing the decode step.

Replace each `raise NotImplementedError(...)` with your answer, then run `make check-exercises`.
"""

import torch

import minipaged  # noqa: F401  (before triton: the interpreter switch on a CPU)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Exercise 14.1: RMSNorm of every row of ``x [N, H]`` (any H) by a Triton kernel."""
    raise NotImplementedError("Exercise 14.1: write a Triton kernel with one program per row "
                              "(edit exercises/ch14_fast_engine.py, rms_norm)")


def fusion_predictions() -> dict:
    """Exercise 14.2: your predictions from chapter 12's profile, made before reading on.

    ``"GPU ms with free glue"``: a step's GPU time in ms if every glue and copy kernel cost
    nothing (attention and the GEMMs unchanged); ``"step speed-up at most"``: how many times
    faster a whole step (GPU time plus host time) would then be; ``"next"``: the part with
    the most time above its floor after that, ``"attention"``, ``"GEMM"`` or ``"host"``.
    """
    raise NotImplementedError("Exercise 14.2: predict what fusing the glue can win "
                              "(edit exercises/ch14_fast_engine.py, fusion_predictions)")


def makespan(loads: list[int], slots: int) -> int:
    """Exercise 14.3: when the last program finishes, in tokens walked.

    Programs start in the order of ``loads`` (tokens each walks), each on the slot that is
    free first; ``slots`` programs run at once.
    """
    raise NotImplementedError("Exercise 14.3: simulate the slots taking programs in order "
                              "(edit exercises/ch14_fast_engine.py, makespan)")
