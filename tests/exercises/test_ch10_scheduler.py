"""Checks for the chapter 10 exercises (exercises/ch10_scheduler.py)."""

import pytest

from tests.exercises.answers import load

ex = load("ch10_scheduler")


def test_10_1_decode_step_blocks():
    assert ex.decode_step_blocks([16, 17, 32, 5], 16) == 2
    assert ex.decode_step_blocks([0, 1, 2, 3, 4], 2) == 3
    assert ex.decode_step_blocks([], 16) == 0


def test_10_2_static_batch_idle_fraction():
    assert ex.static_batch_idle_fraction([10, 20, 30, 40], 2) == pytest.approx(1 / 6)
    assert ex.static_batch_idle_fraction([7, 7, 7], 3) == 0
    assert ex.static_batch_idle_fraction([1, 9], 1) == 0


def test_10_3_preempted_by_decode():
    assert ex.preempted_by_decode([4, 8, 3, 12], 0, 4) == [3]
    assert ex.preempted_by_decode([4, 8, 3, 12], 3, 4) == []
    assert ex.preempted_by_decode([4, 8, 3, 12], 2, 4) == [3]        # the newest evicts itself
    assert ex.preempted_by_decode([4], 0, 4) == [0]                 # alone and stuck: itself
    assert ex.preempted_by_decode([4, 8, 1, 2], 0, 4) == [3, 2]       # one victim per needy sequence
    assert ex.preempted_by_decode([1, 4, 4], 0, 4) == [2]
