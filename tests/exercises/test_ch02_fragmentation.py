"""Checks for the chapter 2 exercises (exercises/ch02_fragmentation.py)."""

import pytest

from minipaged.fragmentation import FirstFitAllocator, TraceRequest, reservation_tokens, simulate
from tests.exercises.answers import load

ex = load("ch02_fragmentation")


def test_2_1_pow2_reservation():
    assert ex.pow2_reservation(500, 2048) == 512
    assert ex.pow2_reservation(1025, 2048) == 2048
    assert ex.pow2_reservation(512, 2048) == 512 and ex.pow2_reservation(513, 2048) == 1024
    assert ex.pow2_reservation(1, 2048) == 1 and ex.pow2_reservation(3000, 2048) == 2048
    for n in range(1, 2049, 7):
        assert ex.pow2_reservation(n, 2048) == reservation_tokens("pow2", n, 2048)


@pytest.mark.parametrize("policy", ["max", "pow2", "oracle"])
@pytest.mark.parametrize("prompt,output", [(100, 300), (7, 0), (1, 1), (900, 1000)])
def test_2_2_token_share_matches_the_simulator(policy, prompt, output):
    reserved = reservation_tokens(policy, prompt + output, 2048)
    run = simulate([TraceRequest(0, prompt, output)], policy, budget_tokens=reserved, max_len=2048)
    measured = run.token_states.mean() / reserved
    assert ex.single_request_token_share(prompt, output, reserved) == pytest.approx(measured)


def test_2_2_seed_numbers():
    assert ex.single_request_token_share(100, 300, 2048) == pytest.approx(250 / 2048)
    assert ex.single_request_token_share(100, 300, 400) == pytest.approx(0.625)


def test_2_3_first_fit():
    holes = [(0, 3), (10, 4), (20, 8)]
    assert [ex.first_fit(holes, n) for n in (4, 5, 9, 3, 8)] == [10, 20, None, 0, 20]
    assert ex.first_fit([], 1) is None


def test_2_3_first_fit_agrees_with_the_allocator():
    heap = FirstFitAllocator(40)
    starts = [heap.allocate(n) for n in (3, 5, 4, 6, 8, 2)]
    for start in starts[1::2]:
        heap.free(start)
    for size in range(1, 10):
        assert ex.first_fit(heap.holes(), size) == heap.allocate(size)


# -- 2.4: best fit, checked against a slot-by-slot model; planted bugs must fail the check ------

def _model_holes(used):
    holes, start = [], None
    for i, taken in enumerate(used + [True]):
        if not taken and start is None:
            start = i
        if taken and start is not None:
            holes.append((start, i - start))
            start = None
    return holes


def check_best_fit(allocator_cls, seeds=range(6), capacity=64):
    """None if ``allocator_cls`` behaves as best fit on random allocate/free runs, else why."""
    import random

    for seed in seeds:
        rng = random.Random(seed)
        heap, used, live = allocator_cls(capacity), [False] * capacity, {}
        for _ in range(120):
            if live and rng.random() < 0.45:
                start = rng.choice(sorted(live))
                heap.free(start)
                for i in range(start, start + live.pop(start)):
                    used[i] = False
            else:
                size = rng.randint(1, 12)
                fits = [(n, s) for s, n in _model_holes(used) if n >= size]
                expected = min(fits)[1] if fits else None
                got = heap.allocate(size)
                if got != expected:
                    return f"seed {seed}: allocate({size}) gave {got}, best fit is {expected}"
                if got is not None:
                    live[got] = size
                    for i in range(got, got + size):
                        used[i] = True
            if heap.holes() != _model_holes(used):
                return f"seed {seed}: holes {heap.holes()} != {_model_holes(used)}"
            if heap.free_tokens != used.count(False):
                return f"seed {seed}: free_tokens {heap.free_tokens} != {used.count(False)}"
    return None


class _TakesFromTheEnd(FirstFitAllocator):
    def allocate(self, size):
        fits = [i for i, hole in enumerate(self._sizes) if hole >= size]
        if not fits:
            return None
        i = min(fits, key=lambda k: (self._sizes[k], self._starts[k]))
        self._sizes[i] -= size
        start = self._starts[i] + self._sizes[i]
        if self._sizes[i] == 0:
            del self._starts[i], self._sizes[i]
        self._regions[start] = size
        self.free_tokens -= size
        return start


class _WorstFit(FirstFitAllocator):
    def allocate(self, size):
        fits = [i for i, hole in enumerate(self._sizes) if hole >= size]
        if not fits:
            return None
        i = max(fits, key=lambda k: (self._sizes[k], -self._starts[k]))
        return self._take(i, size)


class _ForgetsTheCount(FirstFitAllocator):
    def allocate(self, size):
        before = self.free_tokens
        start = ex.BestFitAllocator.allocate(self, size)
        self.free_tokens = before
        return start


def test_2_4_best_fit():
    assert ex.BestFitAllocator(16).allocate(4) == 0
    problem = check_best_fit(ex.BestFitAllocator)
    assert problem is None, problem
    heap = ex.BestFitAllocator(20)                       # holes (0, 6) and (10, 3) after frees
    starts = [heap.allocate(n) for n in (6, 4, 3, 7)]
    heap.free(starts[0])
    heap.free(starts[2])
    assert heap.allocate(3) == 10 and heap.allocate(6) == 0   # first fit would say 0, then None
    # the check refuses the planted bugs
    for buggy in (FirstFitAllocator, _TakesFromTheEnd, _WorstFit, _ForgetsTheCount):
        assert check_best_fit(buggy) is not None, buggy.__name__
