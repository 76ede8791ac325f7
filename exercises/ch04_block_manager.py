"""Chapter 4 exercises: the block manager.

Replace each `raise NotImplementedError(...)` with your answer, then run `make check-exercises`.
"""

from minipaged.memory.block_manager import NoFreeBlocksError, TeachingBlockManager  # noqa: F401


def boundary_rule_counterexamples() -> dict[str, tuple[list[int], list[int], int]]:
    """Exercise 4.1: the decode rule counts one new block for each sequence whose length is a
    multiple of the block size. Return two steps ``(lengths, new_tokens, block_size)`` on which
    it is wrong: ``"under"``, where it reserves fewer blocks than the step needs, and
    ``"over"``, where it reserves more."""
    raise NotImplementedError("Exercise 4.1: find a step on which the boundary rule reserves too "
                              "few blocks, and one where it reserves too many "
                              "(edit exercises/ch04_block_manager.py, "
                              "boundary_rule_counterexamples)")


class AtomicTeachingManager(TeachingBlockManager):
    """Exercise 4.2: the teaching manager with an all-or-nothing step."""

    def step(self, requests: list) -> list[int]:
        """Append one token to each request, in order, and return the slots; if anything fails
        part-way, re-raise it and leave free_list, tables and lengths exactly as they were."""
        raise NotImplementedError("Exercise 4.2: make the step all or nothing "
                                  "(edit exercises/ch04_block_manager.py, "
                                  "AtomicTeachingManager.step)")
