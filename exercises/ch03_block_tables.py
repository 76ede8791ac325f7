"""Chapter 3 exercises: block tables and slot mapping.

Replace each `raise NotImplementedError(...)` with your answer, then run `make check-exercises`.
"""


def counterexamples() -> dict[str, tuple[list[int], int, int]]:
    """Exercise 3.1: for each wrong address function of the chapter's exercise ("logical",
    "swapped", "offset_by_table"), an input ``(block_table, position, block_size)`` on which
    it returns a different (physical block, offset) than the right one. The table holds
    distinct block ids and covers the position."""
    raise NotImplementedError("Exercise 3.1: find an input that exposes each wrong address "
                              "function (edit exercises/ch03_block_tables.py, counterexamples)")


def predict_mean_waste() -> dict[int, float]:
    """Exercise 3.2: the mean number of empty slots in the last block, over sequences of every
    length 1, 2, ..., 4096 (one of each), for block sizes 1, 16 and 256: ``{block_size: mean}``."""
    raise NotImplementedError("Exercise 3.2: predict the mean last-block waste "
                              "(edit exercises/ch03_block_tables.py, predict_mean_waste)")


def pool_is_consistent(tables: dict[str, list[int]], free: list[int], num_blocks: int) -> bool:
    """Exercise 3.3: True iff every block 0..num_blocks-1 is free or in exactly one table (never
    both, never twice) and no out-of-range block appears."""
    raise NotImplementedError("Exercise 3.3: check that tables and free list partition the pool "
                              "(edit exercises/ch03_block_tables.py, pool_is_consistent)")


def choose_block_size(lengths: list[int], max_waste: float = 0.05,
                      max_table: float = 64) -> tuple[int, dict]:
    """Exercise 3.4: a block size (a power of two, 1 to 256) for sequences of these final
    lengths whose last-block waste (a share of the allocated slots) is at most `max_waste` and
    whose mean block table has at most `max_table` entries, with the numbers that defend it:
    `(block_size, {"waste_share": ..., "mean_table_len": ...})`."""
    raise NotImplementedError("Exercise 3.4: choose a block size and report its numbers "
                              "(edit exercises/ch03_block_tables.py, choose_block_size)")


def sentinel_check(make_manager) -> None:
    """Exercise 3.5: `make_manager(num_blocks, block_size)` gives an object with
    `append(seq) -> slot` and `slot(seq, position) -> slot`. Drive it with sentinels and
    `assert` that no slot is written twice and every position reads back its own sentinel;
    a correct manager passes, one with an off-by-one at a block boundary must fail."""
    raise NotImplementedError("Exercise 3.5: write the sentinel assertions "
                              "(edit exercises/ch03_block_tables.py, sentinel_check)")
