"""Chapter 4 exercises: the block manager.

Replace each `raise NotImplementedError(...)` with your answer, then run `make check-exercises`.
"""

from minipaged.block_manager import NoFreeBlocksError, TeachingBlockManager  # noqa: F401


def blocks_for_step(lengths: list[int], new_tokens: list[int], block_size: int) -> int:
    """Exercise 4.1: free blocks a step writing new_tokens[i] tokens to sequence i must reserve."""
    raise NotImplementedError("Exercise 4.1: count the new blocks the whole step needs "
                              "(edit exercises/ch04_block_manager.py, blocks_for_step)")


class AtomicTeachingManager(TeachingBlockManager):
    """Exercise 4.2: the teaching manager with an all-or-nothing step."""

    def step(self, requests: list) -> list[int]:
        """Append one token to each request, in order, and return the slots; if anything fails
        part-way, re-raise it and leave free_list, tables and lengths exactly as they were."""
        raise NotImplementedError("Exercise 4.2: make the step all or nothing "
                                  "(edit exercises/ch04_block_manager.py, "
                                  "AtomicTeachingManager.step)")
