"""Chapter 3 exercises: block tables and slot mapping.

Replace each `raise NotImplementedError(...)` with your answer, then run `make check-exercises`.
"""


def address(block_table: list[int], position: int, block_size: int) -> tuple[int, int]:
    """Exercise 3.1: (physical block, offset) of `position` in the sequence with `block_table`."""
    raise NotImplementedError("Exercise 3.1: return where the token at `position` lives "
                              "(edit exercises/ch03_block_tables.py, address)")


def last_block_waste(length: int, block_size: int) -> int:
    """Exercise 3.2: empty slots in the last block of a sequence of `length` tokens."""
    raise NotImplementedError("Exercise 3.2: return the unused slots of the last block "
                              "(edit exercises/ch03_block_tables.py, last_block_waste)")


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
