"""Chapter 3 exercises: block tables and slot mapping.

Replace each `raise NotImplementedError(...)` with your answer, then run `make check-exercises`.
"""


def address(block_table: list[int], position: int, block_size: int) -> tuple[int, int]:
    """Exercise 3.1: (physical block, offset) of `position` in the sequence with `block_table`."""
    raise NotImplementedError("Exercise 3.1: return (block_table[position // B], position % B) "
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
