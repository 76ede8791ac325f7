"""Chapter 10 exercises: reference solutions."""

import heapq

from minipaged.engine.scheduler import Scheduler, SchedulerConfig, Sequence


def copy_on_write_predictions() -> dict[str, tuple[int, int]]:
    # The count adds one copy per writer into a shared, partly filled block; the step makes one
    # copy fewer when all the sharers write (the last finds the block its own), and none when the
    # shared block is full (a fresh block is needed either way).
    return {"a": (1, 1), "b": (2, 1), "c": (2, 2), "d": (3, 2), "e": (3, 2)}


class PriorityScheduler(Scheduler):
    """Exercise 10.2: a scheduler that preempts by priority (lower value = more important).

    ``priority`` maps a request id to its priority; requests not in it have priority 0.
    """

    def __init__(self, manager, config: SchedulerConfig | None = None,
                 priority: dict[int, int] | None = None) -> None:
        super().__init__(manager, config)
        self.priority = dict(priority or {})

    def select_victim(self, candidates: list[Sequence]) -> Sequence:
        """The least important candidate; among equals, the newest (max keeps the first)."""
        return max(reversed(candidates), key=lambda s: self.priority.get(s.request_id, 0))


def continuous_batching_gain(output_lens: list[int], batch_size: int) -> float:
    """Exercise 10.3: fixed-batch steps / continuous-batching steps."""
    if not output_lens:
        return 1.0
    fixed = sum(max(output_lens[i:i + batch_size])
                for i in range(0, len(output_lens), batch_size))
    seats = [0] * min(batch_size, len(output_lens))  # the step at which each seat frees
    for n in output_lens:
        heapq.heapreplace(seats, seats[0] + n)
    return fixed / max(seats)
