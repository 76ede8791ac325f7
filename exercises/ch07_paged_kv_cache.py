"""Chapter 7 exercises: the paged KV cache.

Replace each `raise NotImplementedError(...)` with your answer, then run `make check-exercises`.
"""

import torch


def slot_of(block_table: list[int], block_size: int, position: int) -> int:
    """Exercise 7.1: the slot (physical_block * block_size + offset) of a logical position."""
    raise NotImplementedError("Exercise 7.1: map a position to its slot through the block table "
                              "(edit exercises/ch07_paged_kv_cache.py, slot_of)")


def last_block_waste(num_tokens: int, block_size: int) -> int:
    """Exercise 7.1: unused slots in the last block of a sequence of num_tokens (0 if it is full)."""
    raise NotImplementedError("Exercise 7.1: count the empty slots of the last block "
                              "(edit exercises/ch07_paged_kv_cache.py, last_block_waste)")


def element_offset(slot: int, head: int, dim: int, block_size: int, num_kv_heads: int,
                   head_dim: int, layout: str) -> int:
    """Exercise 7.2: index of K[slot, head, dim] in one flattened layer of an "NHD" or "HND" cache."""
    raise NotImplementedError("Exercise 7.2: compute the flat element offset for both layouts "
                              "(edit exercises/ch07_paged_kv_cache.py, element_offset)")


def swap_out_reference(gpu_storage: torch.Tensor, cpu_storage: torch.Tensor,
                       pairs: list[tuple[int, int]]) -> None:
    """Exercise 7.3: copy block src of gpu_storage [layers, 2, blocks, ...] to block dst of cpu_storage."""
    raise NotImplementedError("Exercise 7.3: copy each (src, dst) block across, all layers, K and V "
                              "(edit exercises/ch07_paged_kv_cache.py, swap_out_reference)")
