"""Recorded numbers chapter 6 glues into its prose (results/*.json), checked for plausibility."""

import json

from minipaged.runtime import results_path


def test_prefix_caching_step_stays_under_a_millisecond():
    record = json.loads(results_path("slot_mapping_cpu.json").read_text())
    assert record["step_us_median"] < record["prefix_caching_step_us_median"] < 1000


def test_engine_forward_per_step_is_about_14_ms():
    rows = json.loads(results_path("engine_h200.json").read_text())["rows"]
    engine = next(r for r in rows if r["path"] == "minipaged")
    forward_ms = 1000 * engine["forward_seconds"] / engine["steps"]
    assert round(forward_ms, 1) == 14.2     # 7.53 s over 530 steps in the recorded run
