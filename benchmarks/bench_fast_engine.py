"""Chapter 12's engine against ``minipaged.LLM`` (chapters 14 and 15), and the fused kernels against
their references.

    python benchmarks/bench_fast_engine.py --out DIR [--mode engines|kernels|both] [--quick]
                                           [--num-requests N] [--max-tokens T] [--check]
                                           [--workload course|nanovllm]

``engines`` (bench_engine.py's model and workload: random bf16 Qwen3-0.6B shape, 256 requests, prompts
uniform in 100-1024, 512 new tokens, EOS ignored, greedy): chapter 12's ``minipaged.engine.llm_engine.LLMEngine`` and
``minipaged.LLM`` (``minipaged.entrypoints.llm.LLM``: the same ``LLMEngine`` assembled from
``FAST_PARTS``), each in a process of its own on the same seeded model (on a GPU), after a
warm-up that compiles the kernels and captures the CUDA graphs. Per engine: output tokens/s, fraction of
the memory roofline (bench_engine.roofline), mean TTFT, p50/p99 TPOT, steps, graph steps. Writes
DIR/fast_engine_h200.json. ``--check`` (any mode) first runs bench_engine's fp32 parity check
(chapter 12's ``LLMEngine`` against transformers, with and without CUDA graphs and under
preemption; about 30 s); its result goes into fast_engine_h200.json when the engines run.

``kernels``: each fused kernel and fused projection timed alone against its unfused reference, bf16, on
Qwen3-0.6B's sizes (hidden 1024, 16/8 heads of 128, intermediate 3072) at a decode-sized batch (256
tokens) and a prefill-sized one (8192 tokens), with triton's do_bench (median); the largest error of the
fused output relative to the reference's range is recorded too. The paged prefill kernel is timed
against chapter 9's SDPA loop on prompts of up to 512 new tokens, each after a 256-token cached prefix.
Writes DIR/fused_kernels_h200.json.

``--workload nanovllm`` replaces the course workload with nano-vllm's benchmark: 256 requests, prompts
uniform in 100-1024, each request's output length uniform in 100-1024 (seeded), EOS ignored, sampled at
temperature 0.6. Its file is DIR/fast_engine_nanovllm_h200.json.

``--engines`` picks the engines (default all six, built by ``ENGINES``: ``engine``, chapter 12's
``LLMEngine``; ``fast_engine``, ``minipaged.LLM`` (chapters 14 and 15); ``fast_engine_sync``,
the fast engine with ``overlap_scheduling=False``, so that the overlap's share is measured,
``fast_engine_unchunked``, the fast engine with ``enable_chunked_prefill=False`` (whole prompts, run
apart from the step's decodes),
``fast_engine_sdpa_prefill``, the fast engine with chapter 9's prefill, so that the paged prefill
kernel's share of the gain is measured too, and ``fast_engine_fp8``, the fast engine with chapter 13's
e4m3 cache, ``kv_cache_dtype="fp8"``, on a GPU with FP8).

About 3.5 minutes for ``engines`` and under a minute for ``kernels`` on an H200. Without a GPU
(``--quick``): a tiny model and tiny shapes under the Triton interpreter, files ``*_cpu.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.bench_engine import (COPY_BANDWIDTH, build_model, check_parity,  # noqa: E402
                                     qwen3_06b_config, roofline, sync, workload)


def base_engine(model, **options):
    """Chapter 12's engine: ``LLMEngine`` with its own parts."""
    from minipaged.engine.llm_engine import LLMEngine

    return LLMEngine(model, **options)


def minipaged_llm(model, **options):
    """The book's ``minipaged.LLM`` (``LLMEngine`` with ``FAST_PARTS``, chapters 14 and 15)."""
    from minipaged.entrypoints.llm import LLM

    return LLM(model, **options)


def minipaged_llm_sdpa_prefill(model, **options):
    """``minipaged.LLM`` with chapter 9's SDPA prefill: chapter 14's model without chapter
    15's paged prefill part, so a step's prefills and decodes also run apart."""
    llm = minipaged_llm(model, **options)
    llm.model.plan_prefill = None
    return llm


# name -> (constructor, its options, the class it reports, whether it needs FP8)
ENGINES = {
    "engine": (base_engine, {}, "minipaged.engine.llm_engine.LLMEngine", False),
    "fast_engine": (minipaged_llm, {}, "minipaged.entrypoints.llm.LLM", False),
    "fast_engine_sync": (minipaged_llm, {"overlap_scheduling": False}, "minipaged.entrypoints.llm.LLM",
                         False),
    "fast_engine_unchunked": (minipaged_llm, {"enable_chunked_prefill": False},
                              "minipaged.entrypoints.llm.LLM", False),
    "fast_engine_sdpa_prefill": (minipaged_llm_sdpa_prefill, {}, "minipaged.entrypoints.llm.LLM", False),
    "fast_engine_fp8": (minipaged_llm, {"kv_cache_dtype": "fp8"}, "minipaged.entrypoints.llm.LLM", True),
}
"""chapter 12's engine; ``minipaged.LLM``; ``minipaged.LLM`` with one piece changed: no overlap, whole
prompts, chapter 9's SDPA prefill (paged prefill off), chapter 13's e4m3 cache"""


def percentile(values, q):
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def workload_spec(args, on_gpu):
    num_requests = args.num_requests or (256 if on_gpu and not args.quick else 8)
    max_tokens = args.max_tokens or (512 if on_gpu and not args.quick else 16)
    lo, hi = (100, 1024) if on_gpu else (16, 64)
    return num_requests, max_tokens, lo, hi


def sampling(args, num_requests, max_tokens):
    """Per-request SamplingParams of the chosen workload (course: greedy, all ``max_tokens``)."""
    from minipaged.engine.scheduler import SamplingParams

    if args.workload == "course":
        return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    rng = random.Random(1)
    lo, hi = (100, 1024) if torch.cuda.is_available() and not args.quick else (4, 16)
    return [SamplingParams(temperature=0.6, seed=i, max_tokens=rng.randint(lo, hi),
                           ignore_eos=True) for i in range(num_requests)]


def run_engine(name, args) -> dict:
    """One engine on the seeded model and the workload, in this process."""
    from minipaged.engine.scheduler import SamplingParams

    on_gpu = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if on_gpu else ("cpu", torch.float32)
    num_requests, max_tokens, lo, hi = workload_spec(args, on_gpu)
    config = qwen3_06b_config(not on_gpu)
    model = build_model(config, device, dtype)
    prompts = workload(num_requests, lo, hi, config.vocab_size)
    build, options, engine_class, needs_fp8 = ENGINES[name]
    if needs_fp8:  # chapter 13's e4m3 cache under the fast engine
        from minipaged.kernels.fp8_kv_cache import fp8_supported
        if not fp8_supported(device):
            return {"engine": name, "error": "no FP8 on this device"}
    llm = build(model, block_size=16, max_num_seqs=args.max_num_seqs, **options)
    warm_up = [SamplingParams(temperature=0.0, max_tokens=4),  # kernels compiled, graphs
               SamplingParams(temperature=0.6, seed=0, max_tokens=4)]  # captured, both samplers
    llm.generate([[1 + i] * (32 + 7 * i) for i in range(4)], warm_up * 2, use_tqdm=False)
    params = sampling(args, num_requests, max_tokens)
    sync()
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    sync()
    seconds = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    stats = llm.last_run_stats()
    row = {"engine": name, "class": engine_class, "requests": num_requests,
           "output_tokens": tokens, "seconds": seconds, "tok_per_s": tokens / seconds,
           "mean_ttft_s": statistics.mean(llm.stats.ttft) if llm.stats.ttft else None,
           "p50_tpot_s": percentile(llm.stats.tpot, 0.5),
           "p99_tpot_s": percentile(llm.stats.tpot, 0.99), "num_blocks": llm.cache.num_blocks}
    row.update({k: stats[k] for k in ("steps", "graph_steps", "preemptions", "forward_seconds",
                                      "schedule_seconds", "kv_tokens_read")})
    row["host_ms_per_step"] = 1e3 * stats["schedule_seconds"] / max(1, stats["steps"])
    row.update(roofline(config, llm, stats, seconds))
    row["first_tokens"] = outputs[0].outputs[0].token_ids[:8]
    if on_gpu:
        row["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    del llm, outputs
    gc.collect()
    return row


def run_engine_in_child(name, args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        row_file = Path(tmp) / "row.json"
        command = [sys.executable, __file__, "--engine", name, "--row-file", str(row_file),
                   "--max-num-seqs", str(args.max_num_seqs), "--workload", args.workload,
                   ] + ["--quick"] * args.quick
        for flag, value in (("--num-requests", args.num_requests), ("--max-tokens", args.max_tokens)):
            if value is not None:
                command += [flag, str(value)]
        done = subprocess.run(command)
        if row_file.exists():
            return json.loads(row_file.read_text())
        return {"engine": name, "error": f"child exited with {done.returncode} and wrote no row"}


# -- kernels alone ----------------------------------------------------------------------------

def timer(on_gpu):
    if on_gpu:
        from benchmarks.bench_decode_attention import bench
        return bench

    def cpu_us(fn):
        fn()
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        return 1e6 * best

    return cpu_us


def prefill_case(hq, hkv, d, block_size, dtype, device, count, prompt, context):
    """``count`` prompts of ``prompt`` new tokens after ``context`` cached, in a shuffled pool."""
    from minipaged.memory.block_table import blocks_needed
    from minipaged.kernels.kv_cache import PagedKVCache
    from minipaged.model.qwen3 import ForwardBatch

    per_seq = blocks_needed(prompt + context, block_size)
    cache = PagedKVCache(1, count * per_seq, block_size, hkv, d, dtype, device)
    cache.storage.normal_()
    order = torch.randperm(count * per_seq).view(count, per_seq).tolist()
    batch = ForwardBatch.from_sequences([[0] * prompt] * count, [context] * count, order,
                                        block_size, device)
    q, k, v = (torch.randn(count * prompt, h, d, dtype=dtype, device=device) for h in (hq, hkv, hkv))
    cache.write(0, k, v, batch.slot_mapping)
    return q, k, v, batch, cache


def kernel_cases(tokens, device, dtype, small):
    """(name, reference fn, fused fn, args, bytes the fused one must move) per kernel."""
    import torch.nn.functional as F

    from minipaged.kernels.fused_ops import (add_rms_norm, add_rms_norm_reference, qk_norm_rope,
                                             silu_mul, silu_mul_reference)
    from minipaged.kernels.prefill_attention import paged_prefill_attention
    from minipaged.model.fast_qwen3 import qk_norm_rope_reference
    from minipaged.model.qwen3 import prefill_attention, rope_cos_sin, rope_inv_freq

    hidden, hq, hkv, d, inner = (64, 4, 2, 16, 128) if small else (1024, 16, 8, 128, 3072)
    e = torch.finfo(dtype).bits // 8

    def rand(*shape):
        return torch.randn(*shape, device=device, dtype=dtype)

    x, r, w = rand(tokens, hidden), rand(tokens, hidden), rand(hidden)
    qkv = rand(tokens, (hq + 2 * hkv) * d)
    cos, sin = rope_cos_sin(torch.arange(tokens, device=device), rope_inv_freq(d, 1e6), dtype)
    hw = 1 + 0.1 * rand(d)
    gate_up = rand(tokens, 2 * inner)
    wq, wk, wv = rand(hq * d, hidden), rand(hkv * d, hidden), rand(hkv * d, hidden)
    wqkv = torch.cat([wq, wk, wv])
    wg, wu = rand(inner, hidden), rand(inner, hidden)
    wgu = torch.cat([wg, wu])
    n_qk = tokens * (hq + hkv) * d
    prompt = min(512, tokens)
    pq, pk, pv, pbatch, pcache = prefill_case(hq, hkv, d, 16, dtype, device, tokens // prompt,
                                              prompt, 256)
    kv_read = 2 * (tokens // prompt) * (prompt + 256) * hkv * d * e
    return [
        ("add_rms_norm", add_rms_norm_reference, add_rms_norm, (x, r, w, 1e-6),
         4 * tokens * hidden * e + hidden * e),
        ("qk_norm_rope", qk_norm_rope_reference, qk_norm_rope, (qkv, hq, hkv, hw, hw, cos, sin, 1e-6),
         2 * n_qk * e + 2 * tokens * d * e),
        ("silu_mul", silu_mul_reference, silu_mul, (gate_up,), 3 * tokens * inner * e),
        # the projections: the reference is the separate GEMMs (timed without the cat that only
        # lines their outputs up for the error check)
        ("qkv_proj", lambda a: torch.cat([F.linear(a, wq), F.linear(a, wk), F.linear(a, wv)], -1),
         lambda a: F.linear(a, wqkv), (x,), wqkv.numel() * e,
         lambda a: (F.linear(a, wq), F.linear(a, wk), F.linear(a, wv))),
        ("gate_up_proj", lambda a: torch.cat([F.linear(a, wg), F.linear(a, wu)], -1),
         lambda a: F.linear(a, wgu), (x,), wgu.numel() * e,
         lambda a: (F.linear(a, wg), F.linear(a, wu))),
        # prefill attention over a 256-token cached prefix: chapter 9's loop vs the paged kernel
        ("paged_prefill", lambda q, k, v, b, c: prefill_attention(q, k, v, b, c, 0, d ** -0.5),
         lambda q, k, v, b, c: paged_prefill_attention(q, c, 0, b, d ** -0.5),
         (pq, pk, pv, pbatch, pcache), kv_read + 2 * pq.numel() * e),
    ]


def first(out):
    return out[0] if isinstance(out, tuple) else out


def run_kernels(on_gpu, quick) -> list[dict]:
    device = "cuda" if on_gpu else "cpu"
    dtype = torch.bfloat16 if on_gpu else torch.float32
    measure = timer(on_gpu)
    rows = []
    for tokens in ((256, 8192) if on_gpu and not quick else (4, 16)):
        for name, ref, fused, args, nbytes, *timed in kernel_cases(tokens, device, dtype,
                                                                   not on_gpu):
            want, got = first(ref(*args)), first(fused(*args))
            error = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
            ref_timed = timed[0] if timed else ref
            ref_us = measure(lambda: ref_timed(*args))
            fused_us = measure(lambda: fused(*args))
            rows.append({"kernel": name, "tokens": tokens, "dtype": str(dtype),
                         "reference_us": ref_us, "fused_us": fused_us,
                         "speedup": ref_us / fused_us, "max_rel_error": error,
                         "fused_min_bytes": nbytes, "fused_gbps": nbytes / fused_us / 1e3})
            print(f"{name:<13} {tokens:>5} tokens  reference {ref_us:9.1f} µs  fused {fused_us:9.1f} µs"
                  f"  x{ref_us / fused_us:5.2f}  err {error:.1e}", flush=True)
    return rows


def header(on_gpu, args) -> dict:
    return {"device": torch.cuda.get_device_name() if on_gpu else "cpu",
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "command": "python " + " ".join(sys.argv),
            "versions": {"torch": torch.__version__, "triton": __import__("triton").__version__}}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results")
    parser.add_argument("--mode", choices=["engines", "kernels", "both"], default="both")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (and a tiny model on CPU)")
    parser.add_argument("--num-requests", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--check", action="store_true",
                        help="fp32 parity of chapter 12's engine first (GPU)")
    parser.add_argument("--workload", choices=["course", "nanovllm"], default="course",
                        help="course: 512 new tokens each, greedy; nanovllm: 100-1024, T=0.6")
    parser.add_argument("--engines", default=",".join(ENGINES),
                        help="comma-separated, from: " + ", ".join(ENGINES))
    parser.add_argument("--engine", choices=ENGINES, help=argparse.SUPPRESS)     # a child's engine
    parser.add_argument("--row-file", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    on_gpu = torch.cuda.is_available()
    if args.row_file:  # a child: one engine, one row
        try:
            row = run_engine(args.engine, args)
        except Exception as error:
            traceback.print_exc()
            row = {"engine": args.engine, "error": f"{type(error).__name__}: {error}"}
        Path(args.row_file).write_text(json.dumps(row))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    suffix = "h200" if on_gpu else "cpu"
    ok, parity = True, None
    if args.check and on_gpu:
        parity = check_parity("cuda")
        ok &= all(r["identical"] for r in parity.values())
        print("parity:", json.dumps(parity), flush=True)
        torch.cuda.empty_cache()
    if args.mode in ("kernels", "both"):
        result = header(on_gpu, args) | {"rows": run_kernels(on_gpu, args.quick)}
        (out / f"fused_kernels_{suffix}.json").write_text(json.dumps(result, indent=1))
    if args.mode in ("engines", "both"):
        num_requests, max_tokens, lo, hi = workload_spec(args, on_gpu)
        result = header(on_gpu, args) | {
            "workload": {"name": args.workload, "requests": num_requests, "prompt_len": [lo, hi],
                         "max_tokens": max_tokens if args.workload == "course" else "per request",
                         "ignore_eos": True, "greedy": args.workload == "course",
                         "model": "random Qwen3-0.6B shape" if on_gpu else "tiny"},
            "isolation": "one process per engine" if on_gpu else "in one process",
            "copy_bandwidth_bytes_per_s": COPY_BANDWIDTH, "parity_fp32_4_layers": parity,
            "rows": []}
        for name in args.engines.split(","):
            row = run_engine_in_child(name, args) if on_gpu else run_engine(name, args)
            result["rows"].append(row)
            ok &= "error" not in row
            print(f"{name:<12} " + ("error: " + row["error"] if "error" in row else
                  f"{row['tok_per_s']:>9,.0f} tok/s  roofline {row['roofline_fraction']:.0%}  "
                  f"TTFT {row['mean_ttft_s']:.2f} s  TPOT p50 {1e3 * row['p50_tpot_s']:.1f} ms  "
                  f"p99 {1e3 * row['p99_tpot_s']:.1f} ms"), flush=True)
            name_part = "" if args.workload == "course" else f"_{args.workload}"
            (out / f"fast_engine{name_part}_{suffix}.json").write_text(json.dumps(result, indent=1))
        firsts = {tuple(r["first_tokens"]) for r in result["rows"] if "error" not in r}
        if len(firsts) > 1 and args.workload == "course":
            print("note: the engines' first tokens differ (bf16 rounding can do that)")
        elif len(firsts) > 1:
            print("note: the engines' first tokens differ: chapter 14 samples with its own"
                  " generator (Philox keys), chapter 11 with torch.Generator")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
