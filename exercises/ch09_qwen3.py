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


def decode_intensity(config, batch: int, context_len: int) -> float:
    """Exercise 9.3: FLOPs per byte of one bf16 decode step of ``batch`` sequences."""
    raise NotImplementedError("Exercise 9.3: count the FLOPs and bytes of a batched "
                              "decode step (decode_intensity)")


def ridge_batch(config, context_len: int, ridge: float) -> int | None:
    """Exercise 9.3: the smallest batch whose decode intensity reaches ``ridge``, or None."""
    raise NotImplementedError("Exercise 9.3: find the smallest batch that reaches the "
                              "ridge, or show that none does (ridge_batch)")
