"""Chapter 6 exercises: prefix caching.

Replace each `raise NotImplementedError(...)` with your answer, then run `make check-exercises`.
"""

from collections.abc import Callable, Sequence

HashFn = Callable[[int | None, tuple[int, ...]], int]


def predict_changed_hashes() -> dict[str, list[int]]:
    """Exercise 6.1: a prompt of the 40 tokens 0..39 at block size 8 has 5 chained block hashes.
    For each edit, predict the indices of the hashes that change: ``"token_13"`` (token 13
    replaced), ``"token_39"``, ``"token_0"``, ``"append_3"`` (three tokens appended) and
    ``"swap_blocks_3_4"`` (the contents of blocks 3 and 4 exchanged)."""
    raise NotImplementedError("Exercise 6.1: predict which block hashes each edit changes "
                              "(edit exercises/ch06_prefix_caching.py, predict_changed_hashes)")


def reusable_prefix_tokens(prompt: Sequence[int], cached_hashes: set[int], block_size: int,
                           hash_fn: HashFn) -> int:
    """Exercise 6.2: prompt tokens an admission reuses (the last prompt token is always computed)."""
    raise NotImplementedError("Exercise 6.2: return the number of prompt tokens an admission "
                              "reuses (edit exercises/ch06_prefix_caching.py, "
                              "reusable_prefix_tokens)")


def predict_admissions() -> dict[str, list[int]]:
    """Exercise 6.3: predict a prefix-caching manager. After ``A`` (the 10 tokens 0..9) is admitted and prefilled, then released, ``B`` (0..7
    then 100..105), ``C`` (0..7 then 200) and ``D`` (0..7) are admitted and prefilled, in a pool of
    10 blocks of 4 tokens.
    Return ``{"reused": [prompt tokens found in the cache by A, B, C, D],
    "free": [free blocks after A, after releasing A, after B, after C, after D]}``."""
    raise NotImplementedError("Exercise 6.3: predict the reused tokens and the free blocks "
                              "(edit exercises/ch06_prefix_caching.py, predict_admissions)")


def prefix_cache_checks(manager_cls) -> None:
    """Exercise 6.4: assertions that a correct prefix cache passes and a broken one fails.

    ``manager_cls`` takes ``(num_physical_blocks, block_size, hash_fn=...)`` like
    ``PrefixCachingBlockManager``. Build scenarios with it and ``assert`` what a correct cache
    must do; return normally when every assertion holds.
    """
    raise NotImplementedError("Exercise 6.4: choose scenarios for the chapter's four rules and "
                              "assert on them (edit exercises/ch06_prefix_caching.py, "
                              "prefix_cache_checks)")
