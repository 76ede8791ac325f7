"""Chapter 6 exercises: prefix caching.

Replace each `raise NotImplementedError(...)` with your answer, then run `make check-exercises`.
"""

from collections.abc import Callable, Sequence

HashFn = Callable[[int | None, tuple[int, ...]], int]


def block_hashes(token_ids: Sequence[int], block_size: int, hash_fn: HashFn) -> list[int]:
    """Exercise 6.1: chained hashes of the full blocks: h_j = hash_fn(h_{j-1}, tuple(block j)), h_{-1} = None."""
    raise NotImplementedError("Exercise 6.1: return the chained hashes of the full blocks "
                              "(edit exercises/ch06_prefix_caching.py, block_hashes)")


def reusable_prefix_tokens(prompt: Sequence[int], cached_hashes: set[int], block_size: int,
                           hash_fn: HashFn) -> int:
    """Exercise 6.2: prompt tokens an admission reuses (the last prompt token is always computed)."""
    raise NotImplementedError("Exercise 6.2: return the number of prompt tokens an admission "
                              "reuses (edit exercises/ch06_prefix_caching.py, "
                              "reusable_prefix_tokens)")


def blocks_taken(num_prompt_tokens: int, block_size: int, cached_blocks: int, unused_cached_blocks: int) -> int:
    """Exercise 6.3: free blocks admitting a prompt (and computing the rest of it) takes."""
    raise NotImplementedError("Exercise 6.3: return the free blocks the admission takes "
                              "(edit exercises/ch06_prefix_caching.py, blocks_taken)")


def prefix_cache_checks(manager_cls) -> None:
    """Exercise 6.4: assertions that a correct prefix cache passes and a broken one fails.

    ``manager_cls`` takes ``(num_physical_blocks, block_size, hash_fn=...)`` like
    ``PrefixCachingBlockManager``. Build scenarios with it and ``assert`` what a correct cache
    must do; return normally when every assertion holds.
    """
    raise NotImplementedError("Exercise 6.4: choose scenarios for the chapter's four rules and "
                              "assert on them (edit exercises/ch06_prefix_caching.py, "
                              "prefix_cache_checks)")
