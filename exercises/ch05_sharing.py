"""Chapter 5 exercises: reference counts, fork and copy-on-write on the teaching manager.

Replace each `raise NotImplementedError(...)` with your answer, then run `make check-exercises`.
"""

from minipaged.memory.block_manager import NoFreeBlocksError, TeachingBlockManager  # noqa: F401


class SharingTeachingManager(TeachingBlockManager):
    """Exercise 5.1: the teaching manager with reference counts, fork and copy-on-write.

    Keeps chapter 4's attributes (``block_size``, ``free_list``, ``tables``, ``lengths``) and adds
    ``refcounts`` (a list, one count per block) and ``copies`` (the (src, dst) copies, in order).
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        raise NotImplementedError("Exercise 5.1: add self.refcounts and self.copies "
                                  "(edit exercises/ch05_sharing.py, SharingTeachingManager.__init__)")

    def fork(self, request, new_request) -> None:
        """Start new_request sharing every block of request (counts go up, nothing is copied)."""
        raise NotImplementedError("Exercise 5.1: implement fork "
                                  "(edit exercises/ch05_sharing.py, SharingTeachingManager.fork)")

    def append(self, request) -> int:
        """Place the next token; copy-on-write first if it would write into a shared block."""
        raise NotImplementedError("Exercise 5.1: implement append "
                                  "(edit exercises/ch05_sharing.py, SharingTeachingManager.append)")

    def free(self, request) -> None:
        """Drop the request; blocks go back to the free list only when their count reaches zero."""
        raise NotImplementedError("Exercise 5.1: implement free "
                                  "(edit exercises/ch05_sharing.py, SharingTeachingManager.free)")


def cow_assertions(manager_cls) -> None:
    """Exercise 5.2: three copy-on-write assertions (shared before, isolated after, conserved).

    Build a scenario with ``manager_cls(num_blocks, block_size)`` and ``assert`` the three properties;
    a correct manager must pass, a buggy one must make an assertion fail.
    """
    raise NotImplementedError("Exercise 5.2: write the three copy-on-write assertions "
                              "(edit exercises/ch05_sharing.py, cow_assertions)")
