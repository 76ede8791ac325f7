"""Checks for the chapter 11 exercises (exercises/ch11_engine.py)."""

import pytest

from tests.exercises.answers import load

ex = load("ch11_engine")


def test_11_1_nucleus():
    assert ex.nucleus([0.1, 0.5, 0.15, 0.25], 0.7) == {1, 3}
    assert ex.nucleus([0.1, 0.5, 0.15, 0.25], 0.75) == {1, 3}       # mass before token 2 is 0.75
    assert ex.nucleus([0.1, 0.5, 0.15, 0.25], 0.76) == {1, 2, 3}
    assert ex.nucleus([0.1, 0.5, 0.15, 0.25], 1e-9) == {1}          # the top token always stays
    assert ex.nucleus([0.25] * 4, 1.0) == {0, 1, 2, 3}


def test_11_2_decode_roofline():
    value = ex.decode_roofline_tokens_per_s(1.19e9, 114_688, 256, 800, 4.29e12)
    assert value == pytest.approx(256 / ((1.19e9 + 256 * 800 * 114_688) / 4.29e12))
    assert 43_000 < value < 45_000
    alone = ex.decode_roofline_tokens_per_s(1.19e9, 114_688, 1, 800, 4.29e12)
    assert 3_000 < alone < 3_600


def test_11_3_ttft_and_tpot():
    assert ex.ttft_and_tpot(1.0, [1.5, 1.7, 2.1]) == pytest.approx((0.5, 0.3))
    assert ex.ttft_and_tpot(0.0, [2.0]) == (2.0, None)
