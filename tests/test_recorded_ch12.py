"""Chapter 12's recorded H200 run (results/fp8_h200.json), when it exists: its shape and the
correctness it claims. Skipped until benchmarks/bench_fp8.py has been recorded on the GPU."""

import json

import pytest

from minipaged.runtime import results_path

PATH = results_path("fp8_h200.json")
pytestmark = pytest.mark.skipif(not PATH.exists(), reason="fp8_h200.json not recorded yet")


@pytest.fixture(scope="module")
def recorded():
    return json.loads(PATH.read_text())


def test_header_and_shapes(recorded):
    assert {"device", "date", "command", "kernel", "engine"} <= set(recorded)
    shapes = {(r["batch"], r["seq_len"]) for r in recorded["kernel"]}
    assert {(64, 4096), (8, 32768), (256, 1024)} <= shapes
    for r in recorded["kernel"]:
        assert r["fp8_bytes"] < 0.52 * r["bf16_bytes"]            # 1 byte + 4/128 of scales
        assert r["fp8_vs_bf16_rel_err"] < 0.1                       # the same attention


def test_the_gpu_grid_passed(recorded):
    check = recorded.get("check")
    if check is None:
        pytest.skip("recorded without --check")
    assert check["failures"] == [] and check["cuda_graph_equal"] is True


def test_engine_ran_both_caches(recorded):
    if not recorded["engine"]:
        pytest.skip("recorded without the engine run (bench_fp8.py --skip-engine)")
    rows = {r["kv_cache_dtype"]: r for r in recorded["engine"]}
    assert set(rows) == {"auto", "fp8"} and not any("error" in r for r in rows.values())
    assert rows["fp8"]["num_blocks"] > 1.8 * rows["auto"]["num_blocks"]
