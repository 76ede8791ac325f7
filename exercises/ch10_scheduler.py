"""Chapter 10 exercises: the scheduler.

Replace each `raise NotImplementedError(...)` with your answer, then run `make check-exercises`.
"""

from minipaged.engine.scheduler import Scheduler, SchedulerConfig, Sequence


def decode_step_blocks(lengths: list[int], shared_last: list[bool], block_size: int) -> int:
    """Exercise 10.1: free blocks a decode step takes when sequence ``i`` has ``lengths[i]``
    tokens in the cache, writes one more, and its last block is shared iff ``shared_last[i]``."""
    raise NotImplementedError("Exercise 10.1: count the free blocks this decode step takes "
                              "(edit exercises/ch10_scheduler.py, decode_step_blocks)")


class PriorityScheduler(Scheduler):
    """Exercise 10.2: a scheduler that preempts by priority (lower value = more important).

    ``priority`` maps a request id to its priority; requests not in it have priority 0.
    """

    def __init__(self, manager, config: SchedulerConfig | None = None,
                 priority: dict[int, int] | None = None) -> None:
        super().__init__(manager, config)
        self.priority = dict(priority or {})

    def select_victim(self, candidates: list[Sequence]) -> Sequence:
        """The sequence that yields its blocks so that ``candidates[0]`` can run.

        ``candidates`` are the running sequences not yet served in this step, oldest first.
        """
        raise NotImplementedError("Exercise 10.2: pick the victim among the candidates using "
                                  "self.priority (edit exercises/ch10_scheduler.py, "
                                  "PriorityScheduler.select_victim)")


def continuous_batching_gain(output_lens: list[int], batch_size: int) -> float:
    """Exercise 10.3: steps of consecutive fixed batches divided by steps of continuous
    batching with ``batch_size`` seats (requests in order, one token per request per step)."""
    raise NotImplementedError("Exercise 10.3: count the steps both ways and divide "
                              "(edit exercises/ch10_scheduler.py, continuous_batching_gain)")
