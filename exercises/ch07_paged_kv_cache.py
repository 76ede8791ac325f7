"""Chapter 7 exercises: the paged KV cache.

Replace each `raise NotImplementedError(...)` with your answer, then run `make check-exercises`.
"""

import torch


def element_offset(slot: int, head: int, dim: int, block_size: int, num_kv_heads: int,
                   head_dim: int, layout: str, dtype_bytes: int = 2) -> int:
    """Exercise 7.1: index of K[slot, head, dim] in one flattened layer of K.

    ``layout`` is "NHD", "HND" or "V0" (vLLM's original key layout
    ``[blocks, H_kv, D // x, B, x]`` with ``x = 16 // dtype_bytes``).
    """
    raise NotImplementedError("Exercise 7.1: compute the flat element offset in each layout "
                              "(edit exercises/ch07_paged_kv_cache.py, element_offset)")


def write_kv_v0(key_cache: torch.Tensor, value_cache: torch.Tensor, key: torch.Tensor,
                value: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Exercise 7.2: store new tokens into vLLM's original layout.

    ``key_cache`` is ``[num_blocks, H_kv, D // x, B, x]``, ``value_cache`` is
    ``[num_blocks, H_kv, D, B]`` (both contiguous, ``x = 16 // element size``); ``key`` and
    ``value`` are ``[N, H_kv, D]``; slot -1 is skipped and a slot out of range writes nothing.
    """
    raise NotImplementedError("Exercise 7.2: write a Triton kernel that stores K and V in "
                              "vLLM's original layout "
                              "(edit exercises/ch07_paged_kv_cache.py, write_kv_v0)")
