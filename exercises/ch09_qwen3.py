"""Chapter 9 exercises: Qwen3 on the paged cache.

Replace each `raise NotImplementedError(...)` with your answer, then run `make check-exercises`.
"""

import torch

from minipaged.model.qwen3 import Qwen3PagedModel


def from_hf_linear_rope(hf_model) -> Qwen3PagedModel:
    """Exercise 9.1: a paged model for a transformers Qwen3 whose config uses linear RoPE."""
    raise NotImplementedError("Exercise 9.1: build a Qwen3PagedModel that matches a "
                              "linear-RoPE transformers model (from_hf_linear_rope)")


def check_rope(rope) -> None:
    """Exercise 9.2: return for a correct ``rope(x [N, H, D], positions [N])``, theta 1e4;
    raise AssertionError for a wrong one."""
    raise NotImplementedError("Exercise 9.2: write assertions that a wrong rotary "
                              "embedding fails (check_rope)")


def batching_predictions() -> dict[str, float | int | None]:
    """Exercise 9.3: your predictions for bf16 decode steps of Qwen3-0.6B's shape on the H200
    (ridge: dense bf16 FLOP/s over the measured copy bandwidth), made before computing anything.

    ``"batch at context 0"``: the smallest batch whose step reaches the ridge when every
    sequence has 0 cached tokens (None if no batch does); ``"batch at context 4096"``: the same
    at 4,096 cached tokens; ``"limit at context 4096"``: the FLOPs per byte a step approaches as
    the batch grows without bound, at 4,096 cached tokens; ``"longest context"``: the longest
    context at which some batch still reaches the ridge.
    """
    raise NotImplementedError("Exercise 9.3: predict how far batching takes decode "
                              "(edit exercises/ch09_qwen3.py, batching_predictions)")
