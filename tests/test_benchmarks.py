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


def test_bench_slot_mapping_tiny_run_records_what_the_recorded_run_holds(tmp_path):
    out = tmp_path / "slot_mapping.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/bench_slot_mapping.py"),
                           "--num-seqs", "8", "--repeats", "5", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(out.read_text())
    recorded = json.loads((ROOT / "results" / "slot_mapping_cpu.json").read_text())
    assert set(recorded) <= set(record) | {"note"} and record["num_seqs"] == 8


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


@pytest.mark.parametrize("script", ["sweep_fp8_decode.py", "experiment_fp8_subtiles.py",
                                    "experiment_fp8_table_ahead.py",
                                    "sweep_fp8_occupancy.py"])
def test_fp8_kernel_timings_say_they_need_a_gpu_with_fp8(tmp_path, script):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the script measures instead")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "archive" / script),
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


def test_bench_fp8_accuracy_quick_run_records_every_scheme(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/bench_fp8_accuracy.py"),
                           "--quick", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    (record,) = tmp_path.glob("fp8_accuracy_*.json")      # _cpu, or _h200 on a GPU
    result = json.loads(record.read_text())
    assert result["device"] and result["command"].startswith("python ")
    rows = result["attention_sweep"]
    assert [r["outlier x"] for r in rows] == [1, 4, 16]
    for row in rows:
        # e4m3 with the row's own scale keeps the output near the 2**-4 element bound;
        # bf16 (8 bits of mantissa) is closer still
        assert row["bf16"] < row["fp8, per (slot, head)"] < 2 ** -4
    # per-slot scales cost 4 bytes per 128 values over bare fp8, and half of bf16's bytes
    sizes = result["bytes_per_token"]
    assert sizes["fp8, per (slot, head)"] == sizes["fp8, one scale = 1.0"] * 132 / 128
    assert sizes["bf16"] == 2 * sizes["fp8, one scale = 1.0"]
    e2e = result["end_to_end"]
    assert e2e["auto"]["greedy tokens agree"] == 1.0          # fp32 model and cache
    assert e2e["auto"]["logit distance (max)"] < 1e-4
    assert 0 < e2e["fp8"]["logit distance (median)"] < 0.2    # eight bits move the logits


@pytest.mark.parametrize("group, tile", [(4, 64), (3, 64), (8, 32)])
def test_fp8_subtile_kernel_matches_attention_over_the_dequantized_cache(group, tile):
    """The candidate kernel of benchmarks/archive/experiment_fp8_subtiles.py, under the interpreter."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("the interpreter check runs on CPU machines")
    sys.path.insert(0, str(ROOT))
    from benchmarks.bench_fp8 import fill
    from benchmarks.archive.experiment_fp8_subtiles import subtile_attention
    from minipaged.kernels.decode_attention import paged_attention_reference
    from minipaged.kernels.fp8_kv_cache import Fp8PagedKVCache

    gen = torch.Generator().manual_seed(group)
    lengths = [0, 1, 15, 16, 17, 130]             # empty, partial blocks, several tiles
    cache = Fp8PagedKVCache(1, 40, 16, 2, 16, "cpu")
    query, tables, lens = fill(cache, [max(n, 1) for n in lengths], gen, torch.float32,
                               2 * group)
    lens[0] = 0
    ref = paged_attention_reference(query, cache, 0, tables, lens)
    for splits in (1, 3):
        out = subtile_attention(cache, query, tables, lens, tile, 4, 1, splits=splits)
        assert torch.equal(out[0], torch.zeros_like(out[0]))
        assert ((out - ref).norm() / ref.norm()).item() < 1e-5, splits


@pytest.mark.parametrize("layout", ["bf16 NHD", "fp8 NHD", "fp8 HND"])
@pytest.mark.parametrize("length", [1, 37, 130])
def test_kv_gather_floor_reads_every_token_of_every_head(layout, length):
    """benchmarks/archive/experiment_kv_gather_floor.py's loads-only kernel, under the interpreter:
    its per-(sequence, head) sums of K and V words are torch's, in each layout."""
    import torch

    from benchmarks.archive.experiment_kv_gather_floor import (LAYOUTS, gather_sum, make_case,
                                                       reference_sum)

    elem, order = LAYOUTS[layout]
    k, v, tables, strides, words = make_case(2, length, elem, order, "cpu")
    got = gather_sum(k, v, tables, strides, words, length)
    assert torch.equal(got, reference_sum(k, v, tables, order, length))
    assert got.abs().sum() > 0


@pytest.mark.parametrize("kind", ["table", "registers"])
@pytest.mark.parametrize("batch,length,splits", [(2, 70, None), (3, 33, 3), (1, 1, None)])
def test_fp8_table_ahead_candidate_matches_chapter_13(batch, length, splits, kind):
    """benchmarks/archive/experiment_fp8_table_ahead.py's kernels (the block table read a tile ahead;
    the next tile's K/V too) give chapter 13's output exactly, under the interpreter: ranges
    shorter than a tile, splits, a length cut inside a block and an empty sequence."""
    import torch

    from benchmarks.bench_fp8 import paired_caches
    from benchmarks.archive.experiment_fp8_table_ahead import table_ahead_launch

    cache, fp8, query, tables, lens = paired_caches(batch, length, 8, 2, 16, 16, "cpu")
    lens[0] = max(0, length - 5)
    shipped = fp8.paged_attention(query, 0, tables, lens, num_splits=splits)
    with table_ahead_launch(kind=kind):
        ahead = fp8.paged_attention(query, 0, tables, lens, num_splits=splits)
    assert torch.equal(ahead, shipped) and not ahead.isnan().any()
    assert shipped.abs().sum() > 0 or batch == 1


def test_shipped_case_times_both_kernels_and_lets_go_of_its_tensors(monkeypatch):
    """benchmarks/gpu_record.py's shipped_case: chapter 13's output is the reference, both
    kernels are timed on calls that run, a candidate is timed against it (time_candidate),
    and nothing is held once the block ends."""
    import torch

    import benchmarks.archive.gpu_record as gpu_record
    from benchmarks.archive.gpu_record import shipped_case, time_candidate

    outputs, logged = [], []

    def timer(call):
        outputs.append(call())
        return 10.0 * len(outputs)

    with shipped_case(1, 20, 8, log=logged.append, device="cpu", timer=timer) as case:
        assert torch.equal(case.run().float(), case.reference)
        assert case.reference.abs().sum() > 0
        assert (case.bf16_us, case.shipped_us) == (10.0, 20.0)
        assert case.fp8_bytes == 20 * (2 * 8 * 128 + 2 * 8 * 4)
        monkeypatch.setattr(gpu_record, "bench", lambda call: 5.0)
        row = time_candidate({}, lambda: 2 * case.run(), case, log=logged.append)
        assert row["rel_distance_from_chapter12"] == pytest.approx(1.0)
        assert row["us"] == 5.0 and row["speedup_over_bf16"] == 2.0
        failed = time_candidate({}, lambda: 1 / 0, case, log=logged.append)
        assert failed["error"].startswith("ZeroDivisionError") and "us" not in failed
        held, reference = case, case.reference
    assert len(outputs) == 2 and torch.equal(outputs[1].float(), reference)
    assert vars(held) == {} and "B=1 L=20 Hq=8" in logged[0]
