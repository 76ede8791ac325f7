"""Checks for the chapter 2 exercises (exercises/ch02_fragmentation.py)."""

import pytest

from minipaged.book.fragmentation import FirstFitAllocator, TraceRequest, reservation_tokens, simulate
from tests.exercises.answers import load

ex = load("ch02_fragmentation")


def _pow2_by_doubling(total_len, max_len):
    reserved = 1
    while reserved < total_len and reserved < max_len:
        reserved *= 2
    return min(reserved, max_len)


def test_2_1_pow2_predictions():
    predicted = ex.pow2_predictions()
    lengths = (500, 512, 513, 1025, 2000)
    assert sorted(predicted) == list(lengths), f"predict the reservation for each of {lengths}"
    for n in lengths:
        assert predicted[n] == _pow2_by_doubling(n, 2048), \
            f"{n} tokens: you predicted {predicted[n]} slots, Pow2 reserves {_pow2_by_doubling(n, 2048)}"


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


def _first_fit_model(capacity, ops):
    """First fit, slot by slot: a list of booleans, scanned from address 0 for a free run."""
    used, regions, starts = [False] * capacity, {}, []
    for name, arg in ops:
        if name == "free":
            start, size = regions.pop(arg)
            used[start:start + size] = [False] * size
            continue
        start = next((s for s in range(capacity - arg + 1) if not any(used[s:s + arg])), None)
        if start is not None:
            used[start:start + arg] = [True] * arg
            regions[name] = (start, arg)
        starts.append(start)
    return starts, _model_holes(used)


def test_2_3_first_fit_predictions():
    ops = [("a", 8), ("b", 8), ("c", 8), ("free", "a"), ("free", "c"),
           ("d", 4), ("e", 10), ("f", 5), ("g", 5)]
    starts, holes = _first_fit_model(32, ops)
    predicted = ex.first_fit_predictions()
    assert list(predicted["starts"]) == starts[3:], \
        f"you predicted starts {list(predicted['starts'])}, first fit gives {starts[3:]}"
    assert [tuple(h) for h in predicted["holes"]] == holes, \
        f"you predicted holes {predicted['holes']}, first fit leaves {holes}"


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
