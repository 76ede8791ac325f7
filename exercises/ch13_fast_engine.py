"""Chapter 13 exercises: making it fast.

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


def plannable(running: list[tuple[int, int, int]], num_waiting: int, num_swapped: int,
              free_blocks: int, max_num_seqs: int, max_num_batched_tokens: int) -> bool:
    """Exercise 13.3: whether the next step is sure to be a plain decode step.

    ``running`` holds one ``(prompt tokens, output tokens, computed tokens)`` per running
    sequence; ``free_blocks`` is what the scheduler may still claim (after its watermark).
    """
    raise NotImplementedError("Exercise 13.3: return True only when nothing but one decode "
                              "token per running sequence can be scheduled "
                              "(edit exercises/ch13_fast_engine.py, plannable)")


def makespan(loads: list[int], slots: int) -> int:
    """Exercise 13.4: when the last program finishes, in tokens walked.

    Programs start in the order of ``loads`` (tokens each walks), each on the slot that is
    free first; ``slots`` programs run at once.
    """
    raise NotImplementedError("Exercise 13.4: simulate the slots taking programs in order "
                              "(edit exercises/ch13_fast_engine.py, makespan)")
