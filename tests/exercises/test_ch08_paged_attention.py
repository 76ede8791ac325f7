"""Checks for the chapter 8 exercises (exercises/ch08_paged_attention.py)."""

import math

import pytest
import torch

from tests.exercises.answers import load

ex = load("ch08_paged_attention")


def partial(scores: torch.Tensor, values: torch.Tensor):
    m = scores.max().item()
    w = torch.exp(scores - m)
    return (w[:, None] * values).sum(0) / w.sum(), m, w.sum().item()


@pytest.mark.parametrize("cut", [1, 3, 7])
def test_8_1_merge_equals_softmax_over_the_union(cut):
    gen = torch.Generator().manual_seed(cut)
    scores, values = torch.randn(8, generator=gen, dtype=torch.float64) * 4, torch.randn(8, 5, generator=gen, dtype=torch.float64)
    o, m, l = ex.merge_partials(*partial(scores[:cut], values[:cut]), *partial(scores[cut:], values[cut:]))
    assert torch.allclose(o, scores.softmax(0) @ values)
    assert m == pytest.approx(scores.max().item())
    assert l == pytest.approx(torch.exp(scores - scores.max()).sum().item())


def test_8_2_bytes_and_floor():
    assert ex.decode_kv_bytes(64, 4096, 8, 128, 2) == 1 << 30
    assert ex.decode_kv_bytes(1, 1, 1, 1, 4) == 8
    assert ex.time_floor_us(1 << 30, 4.29) == pytest.approx(250.3, abs=0.1)


def test_8_3_split_plan():
    assert ex.split_plan(8, 8, 32768, 132) == 4
    assert ex.split_plan(256, 8, 1024, 132) == 1
    assert ex.split_plan(64, 8, 4096, 132) == 1
    assert ex.split_plan(2, 8, 300, 132) == 1
    assert ex.split_plan(1, 1, 1 << 20, 132) == 64
    assert ex.split_plan(1, 2, 4096, 132) == 16
