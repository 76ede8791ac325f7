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
