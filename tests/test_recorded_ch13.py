"""Recorded runs chapter 13 reads (the profile, the two engines, the fused kernels alone). Each test
skips until its results/ file is recorded; once it is, these hold the run to what the chapter says."""

import json

import pytest

from minipaged.runtime import results_path


def _load(name):
    path = results_path(name)
    if not path.exists():
        pytest.skip(f"{name} not recorded yet")
    data = json.loads(path.read_text())
    assert data["device"] and data["date"] and data["command"].startswith("python ")
    return data


def test_the_profile_covers_every_class_of_a_decode_step():
    window = _load("engine_profile_h200.json")["window"]
    classes = {r["class"]: r for r in window["classes"]}
    assert set(classes) == {"attention", "GEMM", "glue", "copies", "other"}
    assert sum(r["share"] for r in classes.values()) == pytest.approx(1.0)
    assert classes["glue"]["kernels_per_step"] > 0 and classes["attention"]["gpu_us_per_step"] > 0
    assert "floor_us_per_step" in classes["attention"] and "floor_us_per_step" in classes["GEMM"]
    assert window["decode_steps"] > 0 and window["host_us_per_step"] > 0


def test_the_fast_engine_is_measured_beside_chapter_11s_and_is_faster():
    data = _load("fast_engine_h200.json")
    rows = {r["engine"]: r for r in data["rows"]}
    assert {"engine", "fast_engine"} <= set(rows) and all("error" not in r for r in rows.values())
    assert rows["engine"]["output_tokens"] == rows["fast_engine"]["output_tokens"]
    assert rows["fast_engine"]["tok_per_s"] > rows["engine"]["tok_per_s"]
    for row in rows.values():
        assert 0 < row["roofline_fraction"] <= 1 and row["graph_steps"] > 0
        assert row["p50_tpot_s"] <= row["p99_tpot_s"] and row["mean_ttft_s"] > 0
    parity = data.get("parity_fp32_4_layers")
    if parity:
        assert all(r["identical"] for r in parity.values())


def test_nanovllms_workload_is_measured_for_both_engines():
    data = _load("fast_engine_nanovllm_h200.json")
    assert data["workload"]["name"] == "nanovllm" and not data["workload"]["greedy"]
    rows = {r["engine"]: r for r in data["rows"] if "error" not in r}
    assert {"engine", "fast_engine"} <= set(rows)
    assert rows["engine"]["output_tokens"] == rows["fast_engine"]["output_tokens"]
    assert rows["fast_engine"]["tok_per_s"] > rows["engine"]["tok_per_s"]
    assert all(0 < r["roofline_fraction"] <= 1 for r in rows.values())


def test_every_fused_kernel_agrees_with_its_reference_in_bf16():
    rows = _load("fused_kernels_h200.json")["rows"]
    assert {r["kernel"] for r in rows} == {"add_rms_norm", "qk_norm_rope", "silu_mul", "qkv_proj",
                                           "gate_up_proj", "paged_prefill"}
    assert {r["tokens"] for r in rows} == {256, 8192}
    assert all(r["max_rel_error"] < 2e-2 for r in rows)
    decode = {r["kernel"]: r for r in rows if r["tokens"] == 256}
    for name in ("add_rms_norm", "qk_norm_rope", "silu_mul"):   # a fused kernel beats its chain
        assert decode[name]["fused_us"] < decode[name]["reference_us"], name


def test_the_overlap_is_measured_beside_the_synchronous_fast_engine():
    rows = {r["engine"]: r for r in _load("fast_engine_h200.json")["rows"]}
    if "fast_engine_sync" not in rows:
        pytest.skip("no fast_engine_sync row recorded yet")
    sync, overlapped = rows["fast_engine_sync"], rows["fast_engine"]
    assert sync["output_tokens"] == overlapped["output_tokens"]
    assert sync["first_tokens"] == overlapped["first_tokens"]  # greedy: the same tokens
    assert sync["steps"] == overlapped["steps"]


def test_the_step_phases_add_up_to_the_step():
    from benchmarks.profile_step_phases import PHASES

    data = _load("step_phases_fast_engine_h200.json")
    ms = data["ms_per_step"]
    assert set(ms) == set(PHASES) and all(v >= 0 for k, v in ms.items() if k != "rest")
    assert sum(ms.values()) == pytest.approx(data["wall_ms_per_step"], rel=1e-6)
    assert data["host_ms_per_step"] == pytest.approx(data["wall_ms_per_step"] - ms["wait for GPU"])
    assert data["decode_steps"] > 0 and data["mean_batch"] > 1
    overlapped = data.get("overlapped_wall_ms_per_step")
    assert overlapped is None or 0 < overlapped
