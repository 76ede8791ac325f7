"""Checks for the chapter 13 exercises (exercises/ch13_fp8_kv_cache.py)."""

import math

import pytest
import torch

from tests.exercises.answers import load

ex = load("ch13_fp8_kv_cache")
FP8 = torch.float8_e4m3fn


def grade_rounding(fn):
    grid = torch.arange(256, dtype=torch.uint8).view(FP8).float()
    grid = grid[torch.isfinite(grid)].unique()
    positive = grid[grid > 0].sort().values
    ties = (positive[1:] + positive[:-1]) / 2
    near = torch.cat([ties.nextafter(torch.tensor(math.inf)),
                      ties.nextafter(torch.tensor(-math.inf))])
    gen = torch.Generator().manual_seed(0)
    random = torch.randn(20_000, generator=gen) * torch.logspace(-4, 2.5, 20_000)
    x = torch.cat([grid, ties, near, random, torch.tensor([449.0, 464.0, 1e4, 0.0])])
    x = torch.cat([x, -x])
    got = fn(x.clone())
    assert got.shape == x.shape and got.dtype == torch.float32, "fp32, shaped like x"
    want = x.clamp(-448, 448).to(FP8).float()
    bad = got != want
    assert not bad.any(), (f"{int(bad.sum())} values differ, e.g. x={x[bad][:3].tolist()} -> "
                           f"{got[bad][:3].tolist()}, want {want[bad][:3].tolist()}")


def test_12_1_round_to_e4m3():
    grade_rounding(ex.round_to_e4m3)


def _truncates(x):
    x = x.float().clamp(-448, 448)
    _, e = torch.frexp(x)
    spacing = torch.ldexp(torch.ones_like(x), (e - 4).clamp(min=-9))
    return torch.trunc(x / spacing) * spacing


def _ties_away(x):
    x = x.float().clamp(-448, 448)
    _, e = torch.frexp(x)
    spacing = torch.ldexp(torch.ones_like(x), (e - 4).clamp(min=-9))
    return torch.sign(x) * torch.floor(x.abs() / spacing + 0.5) * spacing


def _no_subnormals(x):
    x = x.float().clamp(-448, 448)
    _, e = torch.frexp(x)
    spacing = torch.ldexp(torch.ones_like(x), e - 4)
    return torch.round(x / spacing) * spacing


def _no_saturation(x):
    _, e = torch.frexp(x.float())
    spacing = torch.ldexp(torch.ones_like(x), (e - 4).clamp(min=-9))
    return torch.round(x / spacing) * spacing


@pytest.mark.parametrize("bug", [_truncates, _ties_away, _no_subnormals, _no_saturation])
def test_12_1_planted_bugs_fail_where_yours_passes(bug):
    grade_rounding(ex.round_to_e4m3)
    with pytest.raises(AssertionError):
        grade_rounding(bug)


# Exercise 13.2: a block of 16 rows of one head, appended one at a time with magnitudes that
# grow (and sometimes shrink). After every append each stored row must decode within two e4m3
# steps of what was appended, nothing may saturate, and the scale must be as small as that
# allows (the block's amax over 448, up to rounding).

def grade_append(fn, seed=0):
    gen = torch.Generator().manual_seed(seed)
    block, dim = 16, 32
    codes, scale = torch.zeros(block, dim, dtype=FP8), 1.0
    rows = []
    for i in range(block):
        size = float(torch.exp(torch.randn(1, generator=gen) * 1.5)) * (1 + i)
        row = torch.randn(dim, generator=gen) * size
        codes, scale = fn(codes, scale, i, row)
        assert codes.dtype == FP8 and codes.shape == (block, dim)
        rows.append(row)
        stored = torch.stack(rows)
        amax = float(stored.abs().max())
        assert scale >= amax / 448 * (1 - 1e-6), "a stored row saturates: scale too small"
        assert scale <= amax / 448 * (1 + 1e-3), "the scale is larger than the block needs"
        decoded = codes[:i + 1].float() * scale
        slack = 2 * (2 ** -3 * stored.abs() + 2 ** -9 * scale)   # two roundings, normal/sub
        assert ((decoded - stored).abs() <= slack).all(), \
            f"after appending row {i}, a stored row decodes wrongly"


def test_12_2_append_row():
    for seed in range(3):
        grade_append(ex.append_row, seed)


def _forgets_old_rows(codes, scale, n, row):
    codes = codes.clone()
    scale = max(scale if n else 0.0, float(row.abs().max()) / 448)
    codes[n] = (row / scale).clamp(-448, 448).to(FP8)
    return codes, scale


def _clips_new_row(codes, scale, n, row):
    codes = codes.clone()
    if n == 0:
        scale = float(row.abs().max()) / 448
    codes[n] = (row / scale).clamp(-448, 448).to(FP8)
    return codes, scale


def _shrinks_scale(codes, scale, n, row):
    codes = codes.clone()
    old = codes[:n].float() * scale
    new_scale = float(row.abs().max()) / 448
    codes[:n] = (old / new_scale).clamp(-448, 448).to(FP8)
    codes[n] = (row / new_scale).clamp(-448, 448).to(FP8)
    return codes, new_scale


@pytest.mark.parametrize("bug", [_forgets_old_rows, _clips_new_row, _shrinks_scale])
def test_12_2_planted_bugs_fail_where_yours_passes(bug):
    grade_append(ex.append_row)
    with pytest.raises(AssertionError):
        for seed in range(3):
            grade_append(bug, seed)
