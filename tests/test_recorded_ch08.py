"""Recorded H200 numbers that chapter 8's prose and figures rely on (results/*.json).

The chapter glues these values into its text; these checks fail when a re-recorded run changes
them enough that the prose around them (\"paging costs at most a few percent\", \"several times
faster at long context\") would no longer be true.
"""

import json

import pytest

from minipaged.runtime import results_path


def load(name):
    path = results_path(name)
    if not path.exists():
        pytest.skip(f"{name} not recorded")
    return json.loads(path.read_text())


def us(rows, impl, batch, block_size=16, q_heads=32):
    return [r["median_us"] for r in rows if r["impl"] == impl and r["median_us"]
            and r["shape"]["batch"] == batch and r["shape"]["block_size"] == block_size
            and r["shape"]["q_heads"] == q_heads and not r.get("sweep")]


def test_paged_kernel_matches_sdpa_contiguous():
    rows = load("decode_attention_h200.json")["rows"]
    sdpa = {(b, h): min(us(rows, "sdpa_contiguous_gqa", b, 16, h)
                        + us(rows, "sdpa_contiguous_grouped", b, 16, h))
            for b in (64, 8, 256) for h in (16, 32)}
    speed = [sdpa[b, h] / t for (b, h) in sdpa for bs in (16, 32, 64)
             for t in us(rows, "triton_paged", b, bs, h)]
    assert len(speed) == 18 and 0.975 <= min(speed) and max(speed) <= 1.005
    ours = [r["gbps"] / 1000 for r in rows if r["impl"] == "triton_paged" and not r.get("sweep")]
    assert 4.07 <= min(ours) and max(ours) <= 4.21
    gather_x = [g / t for (b, h) in sdpa
                for g, t in zip(us(rows, "gather_then_sdpa", b, 16, h),
                                us(rows, "triton_paged", b, 16, h))]
    assert 12 <= min(gather_x) and max(gather_x) <= 13
    assert [round(us(rows, "flex_paged", b)[0]) for b in (64, 256, 8)] == [474, 348, 3227]
    assert round(min(us(rows, "sdpa_contiguous_gqa", 64)), 1) == 254.5


def test_version_1_rows_ran_without_a_split():
    rows = load("decode_attention_h200.json")["rows"]
    splits = {r["shape"]["batch"]: r["splits"] for r in rows
              if r["impl"] == "triton_paged" and not r.get("sweep")}
    assert splits == {64: 1, 256: 1, 8: 4}


def test_split_buys_at_long_context_and_costs_at_short():
    rows = [r for r in load("decode_attention_tune_h200.json")["rows"]
            if r["warps"] == 4 and r["stages"] == 3]
    t = {(r["shape"]["batch"], r["splits"], r["tile"]): r["median_us"] for r in rows}
    assert round(t[8, 1, 64]) == 898 and round(t[8, 4, 128]) == 258
    assert t[8, 1, 64] / t[8, 4, 128] > 3                    # "several times faster"
    assert round(t[64, 1, 64]) == 251 and round(t[64, 2, 128] - t[64, 1, 64]) == 16
    assert t[256, 2, 128] > t[256, 1, 64]                    # a split only adds work there
    best = {b: min((r for r in rows if r["shape"]["batch"] == b), key=lambda r: r["median_us"])
            for b in (64, 256, 8)}
    assert best[64]["splits"] == best[256]["splits"] == 1 and best[8]["splits"] == 4


def test_block_size_barely_matters():
    sweep = {r["shape"]["block_size"]: r["median_us"]
             for r in load("decode_attention_h200.json")["rows"] if r.get("sweep") == "block_size"}
    assert min(sweep, key=sweep.get) == 32
    assert round(sweep[32], 1) == 254.7 and round(sweep[16], 1) == 256.6
    assert all(259 <= sweep[s] <= 261 for s in (1, 2, 4, 8))
    assert all(255 <= sweep[s] < 257 for s in (64, 128, 256))
