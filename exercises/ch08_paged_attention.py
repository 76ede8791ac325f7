"""Chapter 8 exercises: paged decode attention.

Replace each `raise NotImplementedError(...)` with your answer, then run `make check-exercises`.
"""

import torch

from minipaged.kernels.kv_cache import PagedKVCache


def decode_step_kv_bytes(total_tokens: int, num_layers: int, num_kv_heads: int, head_dim: int,
                         dtype_bytes: int) -> int:
    """Exercise 8.1: bytes of K and V one decode step reads, over all layers."""
    raise NotImplementedError("Exercise 8.1: count the K/V bytes a decode step reads "
                              "(edit exercises/ch08_paged_attention.py, decode_step_kv_bytes)")


def kv_equals_weights(weight_bytes: int, num_layers: int, num_kv_heads: int, head_dim: int,
                      dtype_bytes: int) -> float:
    """Exercise 8.1: cached tokens at which a step reads as many K/V bytes as weight bytes."""
    raise NotImplementedError("Exercise 8.1: find the cache size that weighs as much as the model "
                              "(edit exercises/ch08_paged_attention.py, kv_equals_weights)")


def sliding_window_attention(query: torch.Tensor, cache: PagedKVCache, layer: int,
                             block_tables: torch.Tensor, seq_lens: torch.Tensor, window: int,
                             scale: float | None = None) -> torch.Tensor:
    """Exercise 8.2: decode attention over each sequence's last ``window`` tokens only.

    Same arguments and result as ``minipaged.paged_attention`` (no split needed), plus
    ``window``: sequence ``b`` attends to positions ``[max(0, L - window), L)``.
    """
    raise NotImplementedError("Exercise 8.2: write a Triton decode kernel for a sliding window "
                              "(edit exercises/ch08_paged_attention.py, "
                              "sliding_window_attention)")
