"""Chapter 8 exercises: paged decode attention.

Replace each `raise NotImplementedError(...)` with your answer, then run `make check-exercises`.
"""

import torch

from minipaged.kernels.kv_cache import PagedKVCache


def kv_crossover_predictions() -> dict[str, float]:
    """Exercise 8.1: your predictions, made before running anything.

    ``"tokens"``: cached tokens (summed over the batch) at which one decode step of Qwen3-0.6B's
    shape reads as many bytes of K and V as it reads weight bytes (1.2e9); ``"batch of 64 x
    1,000"``: that batch's K/V bytes divided by the weight bytes; and three ratios, the
    crossover after a change divided by the crossover before it: ``"4 KV heads"``,
    ``"fp8 cache"`` (one byte per element) and ``"32 query heads"``.
    """
    raise NotImplementedError("Exercise 8.1: predict where the KV cache outweighs the model "
                              "(edit exercises/ch08_paged_attention.py, "
                              "kv_crossover_predictions)")


def window_tile_starts(length: int, window: int, tile: int) -> list[int]:
    """Exercise 8.2: the first positions of the tiles a sliding-window kernel loads for a
    sequence of ``length`` tokens, in order: every window position in some tile, every tile
    aligned to ``tile``, no tile wholly before the window or wholly past the end."""
    raise NotImplementedError("Exercise 8.2: plan the tiles the window kernel loads "
                              "(edit exercises/ch08_paged_attention.py, window_tile_starts)")


def sliding_window_attention(query: torch.Tensor, cache: PagedKVCache, layer: int,
                             block_tables: torch.Tensor, seq_lens: torch.Tensor, window: int,
                             scale: float | None = None) -> torch.Tensor:
    """Exercise 8.2: decode attention over each sequence's last ``window`` tokens only.

    Same arguments and result as ``minipaged.paged_attention`` (no split needed), plus
    ``window``: sequence ``b`` attends to positions ``[max(0, L - window), L)``. The kernel
    walks the tiles of ``window_tile_starts(L, window, TILE)``, called here by that name for
    every sequence (the check swaps in wrong plans under the same name).
    """
    raise NotImplementedError("Exercise 8.2: write a Triton decode kernel for a sliding window "
                              "(edit exercises/ch08_paged_attention.py, "
                              "sliding_window_attention)")
