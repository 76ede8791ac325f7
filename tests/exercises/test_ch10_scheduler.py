"""Checks for the chapter 10 exercises (exercises/ch10_scheduler.py)."""

import heapq
import random

import pytest

from minipaged.memory.block_manager import KVBlockManager
from minipaged.engine.scheduler import SamplingParams, Scheduler, SchedulerConfig, Sequence
from minipaged.memory.sharing import SharingBlockManager
from tests.exercises.answers import load

ex = load("ch10_scheduler")


# Exercise 10.1: predictions, checked on chapter 5's manager: what it counts before the step and
# what the step takes from the free list.

COW_STEPS = {   # name: (tokens A holds, the forks of A, tokens each sequence writes)
    "a": (7, ["B"], {"B": 1}),
    "b": (7, ["B"], {"A": 1, "B": 1}),
    "c": (8, ["B"], {"A": 1, "B": 1}),
    "d": (7, ["B", "C"], {"A": 1, "B": 1, "C": 1}),
    "e": (6, ["B"], {"A": 1, "B": 3}),
}


def measured_cow_step(length, forks, step):
    manager = SharingBlockManager(16, 4)
    manager.create_sequence("A")
    manager.append_tokens("A", length)
    for child in forks:
        manager.fork("A", child)
    counted = manager.num_blocks_to_allocate(step)
    free = manager.num_free_blocks
    reservation = manager.reserve_step(step)
    taken = free - manager.num_free_blocks
    manager.commit_step(reservation)
    assert manager.first_inconsistency() is None
    return counted, taken


def check_cow_predictions(predicted):
    assert set(predicted) == set(COW_STEPS), f"predict steps {sorted(COW_STEPS)}"
    for name, scenario in COW_STEPS.items():
        truth = measured_cow_step(*scenario)
        assert tuple(predicted[name]) == truth, (
            f"step {name}: you predicted (counted, taken) = {tuple(predicted[name])}, "
            f"the manager gives {truth}")


def test_10_1_copy_on_write_predictions():
    check_cow_predictions(ex.copy_on_write_predictions())


_RIGHT_10_1 = {"a": (1, 1), "b": (2, 1), "c": (2, 2), "d": (3, 2), "e": (3, 2)}


@pytest.mark.grader
def test_10_1_the_check_accepts_right_predictions():
    check_cow_predictions(_RIGHT_10_1)


@pytest.mark.parametrize("wrong", [
    {"b": (2, 2), "d": (3, 3), "e": (3, 3)},     # every writer copies
    {"b": (1, 1), "d": (2, 2), "e": (2, 2)},     # the count is exact
    {"c": (2, 0)},                                # a full shared block is written in place
])
@pytest.mark.grader
def test_10_1_the_check_rejects_wrong_predictions(wrong):
    with pytest.raises(AssertionError):
        check_cow_predictions({**_RIGHT_10_1, **wrong})


# Exercise 10.2: the grader, and versions with planted bugs that it must reject.

def _workload(seed, num=14):
    rng = random.Random(seed)
    return [([rng.randrange(1000) for _ in range(rng.randint(4, 30))],
             SamplingParams(max_tokens=rng.randint(8, 30), ignore_eos=True),
             rng.randint(0, 2)) for _ in range(num)]


def check_priority_scheduler(cls):
    """Raise AssertionError unless ``cls`` preempts the least important, newest first."""
    choices = 0
    for seed, mode in [(s, m) for s in range(6) for m in ("recompute", "swap")]:
        requests = _workload(seed)
        priority = {i: p for i, (_, _, p) in enumerate(requests) if p}  # 0: left out
        log = []

        class Probe(cls):
            def select_victim(self, candidates):
                victim = super().select_victim(list(candidates))
                log.append((list(candidates), victim))
                return victim

        manager = SharingBlockManager(20, 4, num_cpu_blocks=64)
        scheduler = Probe(manager, SchedulerConfig(
            max_num_seqs=8, max_num_batched_tokens=64, max_model_len=128,
            preemption_mode=mode), priority=priority)
        for i, (prompt, params, _) in enumerate(requests):
            scheduler.add(Sequence(i, i, prompt, params))
        finished = []
        try:
            for _ in range(3000):
                if not scheduler.has_unfinished():
                    break
                out = scheduler.schedule()
                assert out.chunks, "the scheduler stalled"
                sampled = {c.seq.seq_id: 7 for c in out.chunks if c.samples}
                finished += scheduler.commit(out, sampled)
                scheduler.check_invariants()
        except (AssertionError, NotImplementedError):
            raise
        except Exception as error:  # a wrong victim can break the scheduler's books
            raise AssertionError(f"the scheduler failed: {error!r}") from error
        assert not scheduler.has_unfinished(), "the workload did not finish"
        assert manager.num_free_blocks == 20, "blocks leaked"
        assert sorted(len(s.output_token_ids) for s in finished) == sorted(
            p.max_tokens for _, p, _ in requests)
        for candidates, victim in log:
            assert any(victim is c for c in candidates), "the victim must be a candidate"
            rank = [priority.get(c.request_id, 0) for c in candidates]
            worst = max(rank)
            assert priority.get(victim.request_id, 0) == worst, (
                "a more important sequence was preempted while a less important one ran")
            newest = max(i for i, r in enumerate(rank) if r == worst)
            assert victim is candidates[newest], "among equals, the newest must yield"
            choices += len(set(rank)) > 1
    assert choices > 0


class _Base(Scheduler):
    def __init__(self, manager, config=None, priority=None):
        super().__init__(manager, config)
        self.priority = dict(priority or {})


class IgnoresPriority(_Base):
    """Bug: the plain policy, the newest yields whatever its priority."""


class Inverted(_Base):
    """Bug: treats a lower value as less important."""

    def select_victim(self, candidates):
        return max(reversed(candidates), key=lambda s: -self.priority.get(s.request_id, 0))


class OldestAmongEquals(_Base):
    """Bug: among equally important candidates, the oldest yields."""

    def select_victim(self, candidates):
        return max(candidates, key=lambda s: self.priority.get(s.request_id, 0))


class ChoosesAmongAllRunning(_Base):
    """Bug: picks from the whole running queue, so a sequence already served can be chosen."""

    def select_victim(self, candidates):
        return max(reversed(self.running), key=lambda s: self.priority.get(s.request_id, 0))


class Correct(_Base):
    def select_victim(self, candidates):
        return max(reversed(candidates), key=lambda s: self.priority.get(s.request_id, 0))


@pytest.mark.grader
def test_10_2_the_grader_accepts_a_correct_policy():
    check_priority_scheduler(Correct)


@pytest.mark.parametrize("bug", [IgnoresPriority, Inverted, OldestAmongEquals,
                                 ChoosesAmongAllRunning])
@pytest.mark.grader
def test_10_2_the_grader_rejects_planted_bugs(bug):
    with pytest.raises(AssertionError):
        check_priority_scheduler(bug)


def test_10_2_priority_aware_preemption():
    check_priority_scheduler(ex.PriorityScheduler)


def _continuous_steps(lens, seats):
    clocks = [0] * min(seats, len(lens))
    for n in lens:
        heapq.heapreplace(clocks, clocks[0] + n)
    return max(clocks)


def test_10_3_continuous_batching_gain():
    assert ex.continuous_batching_gain([10, 20, 30, 40], 2) == pytest.approx(1.0)
    assert ex.continuous_batching_gain([40, 10, 10, 10, 10], 2) == pytest.approx(1.5)
    assert ex.continuous_batching_gain([7, 7, 7, 7], 2) == pytest.approx(1.0)
    rng = random.Random(0)
    for _ in range(20):
        lens = [rng.randint(1, 100) for _ in range(rng.randint(1, 40))]
        seats = rng.randint(1, 8)
        fixed = sum(max(lens[i:i + seats]) for i in range(0, len(lens), seats))
        assert ex.continuous_batching_gain(lens, seats) == pytest.approx(
            fixed / _continuous_steps(lens, seats))
