"""Chapter 10 exercises: the scheduler.

Replace each `raise NotImplementedError(...)` with your answer, then run `make check-exercises`.
"""

from minipaged.engine.scheduler import Scheduler, SchedulerConfig, Sequence


def copy_on_write_predictions() -> dict[str, tuple[int, int]]:
    """Exercise 10.1: for each step of the exercise (block size 4), your prediction
    ``(counted, taken)``: the blocks ``num_blocks_to_allocate`` counts for the step, and the free
    blocks ``reserve_step`` actually takes. Steps ``"a"`` to ``"e"``, as the chapter lists them."""
    raise NotImplementedError("Exercise 10.1: predict what the manager counts and takes "
                              "(edit exercises/ch10_scheduler.py, copy_on_write_predictions)")


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
