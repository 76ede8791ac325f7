"""Recorded H200 numbers that chapter 7's prose and figures rely on (results/*.json).

The chapter glues these values into its text; these checks fail when a re-recorded run changes
them enough that what the prose says about them ("the two layouts read at the same speed", "a
swap is bounded by the host link") would no longer hold.
"""

import json

import pytest

from minipaged.runtime import results_path


def load(name):
    path = results_path(name)
    if not path.exists():
        pytest.skip(f"{name} not recorded")
    return json.loads(path.read_text())


def test_layouts_read_and_write_at_the_same_speed():
    rec = {(r["impl"], r["shape"]["block_size"]): r["median_us"]
           for r in load("kv_cache_layout_h200.json")["rows"]}
    attention = [round(rec["attention " + lay, bs], 1) for bs in (16, 64) for lay in ("NHD", "HND")]
    assert attention == [256.0, 257.8, 255.5, 255.3]
    assert all(abs(rec["attention NHD", bs] / rec["attention HND", bs] - 1) < 0.01
               for bs in (16, 64))
    assert [round(rec["write " + lay, bs]) for bs in (16, 64) for lay in ("NHD", "HND")] == [
        11, 11, 35, 41]
    reference = [v for (impl, _), v in rec.items() if impl.startswith("write_reference")]
    assert 240 <= min(reference) and max(reference) <= 320


def test_swap_is_bounded_by_the_link_and_pinned_memory_matters():
    swap = load("swap_copy_h200.json")
    rows = {r["blocks"]: r for r in swap["rows"]}
    assert all(r["identical"] for r in swap["rows"])
    big = rows[64]
    assert [round(big[k]) for k in ("out_link_gb_per_s", "out_minipaged_gb_per_s",
                                    "in_minipaged_gb_per_s")] == [53, 15, 20]
    assert [round(big[k], 1) for k in ("out_pageable_gb_per_s", "in_pageable_gb_per_s")] == [
        1.2, 3.4]
    assert swap["block_bytes"] == 28 * 2 * 16 * 8 * 128 * 2          # one Qwen3-0.6B block
    per_block_link_us = swap["block_bytes"] / (big["out_link_gb_per_s"] * 1e9) * 1e6
    per_block_card_us = 2 * swap["block_bytes"] / 4.29e12 * 1e6
    assert round(per_block_link_us) == 35 and per_block_link_us / per_block_card_us > 30
