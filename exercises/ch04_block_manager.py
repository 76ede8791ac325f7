"""Chapter 4 exercises: the block manager.

Replace each `raise NotImplementedError(...)` with your answer, then run `make check-exercises`.
"""


def conserved(num_blocks: int, free_blocks: list[int], tables: dict[str, list[int]]) -> bool:
    """Exercise 4.1: True iff every block 0..num_blocks-1 is in exactly one place (free or one table)."""
    raise NotImplementedError("Exercise 4.1: check that free list and tables partition the pool "
                              "(edit exercises/ch04_block_manager.py, conserved)")


def blocks_for_step(lengths: list[int], new_tokens: list[int], block_size: int) -> int:
    """Exercise 4.2: free blocks a step writing new_tokens[i] tokens to sequence i must reserve."""
    raise NotImplementedError("Exercise 4.2: count the new blocks the whole step needs "
                              "(edit exercises/ch04_block_manager.py, blocks_for_step)")


def decode_slot_mapping(tables: list[list[int]], lengths: list[int], block_size: int) -> list[int]:
    """Exercise 4.3: the slot of the next token (position lengths[i]) of every sequence."""
    raise NotImplementedError("Exercise 4.3: map each sequence's next position to its slot "
                              "(edit exercises/ch04_block_manager.py, decode_slot_mapping)")
