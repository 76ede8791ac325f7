"""Chapter 10 exercises: the scheduler.

Replace each `raise NotImplementedError(...)` with your answer, then run `make check-exercises`.
"""


def decode_step_blocks(lengths: list[int], block_size: int) -> int:
    """Exercise 10.1: new blocks a decode step needs when each sequence (``lengths`` tokens in the
    cache, no sharing) writes one more token."""
    raise NotImplementedError("Exercise 10.1: count the sequences whose last block is full "
                              "(edit exercises/ch10_scheduler.py, decode_step_blocks)")


def static_batch_idle_fraction(output_lens: list[int], batch_size: int) -> float:
    """Exercise 10.2: fraction of seat-steps that produce no token when requests run in consecutive
    fixed batches of ``batch_size``, each lasting as long as its longest request."""
    raise NotImplementedError("Exercise 10.2: compare seat-steps with useful steps "
                              "(edit exercises/ch10_scheduler.py, static_batch_idle_fraction)")


def preempted_by_decode(lengths: list[int], free_blocks: int, block_size: int) -> list[int]:
    """Exercise 10.3: indices (admission order) preempted by recompute so that a decode step fits:
    serve the oldest first; while a sequence cannot get its new block, preempt the newest sequence
    not yet served (possibly itself). Returns the indices in the order they are preempted."""
    raise NotImplementedError("Exercise 10.3: walk the queue, preempt from the back "
                              "(edit exercises/ch10_scheduler.py, preempted_by_decode)")
