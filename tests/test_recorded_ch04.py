"""Chapter 4's recorded numbers: what the prose says about results/slot_mapping_cpu.json, and a
tiny run of the benchmark that records it."""

import json
import subprocess
import sys

from tests.conftest import ROOT

RECORD = json.loads((ROOT / "results" / "slot_mapping_cpu.json").read_text())


def test_the_record_is_the_benchmark_chapter_4_describes():
    assert RECORD["num_seqs"] == 256 and RECORD["block_size"] == 16
    assert RECORD["prefill_tokens"] == 8 * 1024
    assert RECORD["command"].startswith("python benchmarks/bench_slot_mapping.py")
    assert "baseline" not in RECORD["command"] and "comparison" not in RECORD


def test_a_decode_step_is_within_budget():
    assert RECORD["step_us_median"] < RECORD["target_us"] and RECORD["meets_target"]


def test_the_table_array_is_what_makes_it_fast():
    r = RECORD
    # decode: the gather is the cheapest way to the slots; chapter 3's checked version costs
    # "several times" as much
    assert r["mirror_gather_us_median"] < min(r["slot_mapping_python_us_median"],
                                              r["slot_mapping_us_median"])
    assert r["ch3_slots_for_positions_us_median"] > 2 * r["mirror_gather_us_median"]
    # prefill: NumPy beats a Python formula per token, and the gather beats both
    assert r["prefill_slots_numpy_us_median"] < r["prefill_slots_python_us_median"] / 3
    assert r["prefill_slots_gather_us_median"] < r["prefill_slots_numpy_us_median"]
    # the block-table tensor: one gather instead of 256 row copies
    assert r["block_table_tensor_us_median"] < r["block_table_from_lists_us_median"] / 10


def test_the_benchmark_runs(tmp_path):
    out = tmp_path / "slot_mapping.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/bench_slot_mapping.py"),
                           "--num-seqs", "8", "--repeats", "5", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(out.read_text())
    assert set(RECORD) <= set(record) | {"note"} and record["num_seqs"] == 8
