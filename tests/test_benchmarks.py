"""The benchmark scripts run end to end on a tiny model on CPU (no timing is asserted)."""

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def test_bench_policies_tiny_run_preempts_and_keeps_tokens(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/bench_policies.py"), "--quick",
                           "--out", str(tmp_path), "--num-requests", "6", "--max-tokens", "8",
                           "--rate", "50"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "policies.json").read_text())
    assert result["device"] == "cpu" and result["command"].startswith("python ")
    rows = {(r["experiment"], r["run"].split(",")[0].split(" (")[0]): r for r in result["rows"]}
    assert set(rows) == {("preemption", "no preemption"), ("preemption", "recompute"),
                         ("preemption", "swap"), ("arrivals", "decode_first"), ("arrivals", "prefill_first")}
    for mode in ("recompute", "swap"):
        row = rows["preemption", mode]
        assert row["preemptions"] > 0                        # the small cache did force preemption
        assert row["requests_identical_to_reference"] == 6   # fp32: preemption changes no token
    # swap re-prefills nothing (recompute may, or may find its blocks still in the prefix cache)
    assert rows["preemption", "recompute"]["prefill_tokens"] >= rows["preemption", "recompute"]["prompt_tokens"]
    assert rows["preemption", "swap"]["prefill_tokens"] == rows["preemption", "swap"]["prompt_tokens"]
    assert all(rows["arrivals", p]["steps"] > 0 for p in ("decode_first", "prefill_first"))


def test_bench_engine_rejects_an_unknown_path():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/bench_engine.py"), "--paths", "vllm"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "unknown path(s) ['vllm']" in done.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="the benchmark runs on Linux")
def test_bench_swap_copy_says_it_needs_a_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the script measures instead")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/bench_swap_copy.py")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "needs a GPU" in done.stdout


def test_sweep_fp8_decode_says_it_needs_a_gpu_with_fp8(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the script measures instead")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/sweep_fp8_decode.py"),
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "needs a GPU with FP8" in done.stdout
    assert not any(tmp_path.iterdir())


def test_profile_step_phases_stub_run_times_every_phase(tmp_path):
    """The host's work alone (zero logits for the model), with and without the overlap."""
    from benchmarks import profile_step_phases

    argv = ["--stub", "--num-requests", "6", "--max-tokens", "5", "--out", str(tmp_path)]
    assert profile_step_phases.main(argv) == 0
    data = json.loads((tmp_path / "step_phases_fast_engine_stub.json").read_text())
    assert set(data["ms_per_step"]) == set(profile_step_phases.PHASES)
    assert data["decode_steps"] > 0 and data["mean_batch"] > 1
    assert data["ms_per_step"]["schedule"] > 0 and data["ms_per_step"]["commit"] > 0
    assert data["overlapped_wall_ms_per_step"] > 0
