"""Where a decode step of the engine goes: GPU kernels by class, and host time, on the course workload.

    python benchmarks/profile_engine.py [--out DIR] [--engine engine|fast_engine] [--quick]
                                        [--num-requests N] [--window STEPS]

Runs chapter 12's engine (``--engine engine``, the default: ``minipaged.engine.llm_engine.LLMEngine``) or
the package's (``--engine fast_engine``: ``minipaged.LLM``, i.e. ``minipaged.entrypoints.llm.LLM``; see ``ENGINES``)
on bench_engine.py's model and workload (random bf16 Qwen3-0.6B shape, prompts uniform in 100-1024,
512 new tokens, EOS ignored, greedy), one ``step()`` at a time. Every step is timed (the engine reads
its sampled tokens back each step, so a step's wall time is its GPU time plus what the host adds).
Once no request is waiting any more, ``--window`` decode steps (after ``--settle`` more) run under
``torch.profiler``; their kernels are sorted into classes by name:

- ``attention``: the paged decode kernel (and its split-merge), prefill SDPA/flash kernels;
- ``GEMM``: cuBLAS/CUTLASS matrix multiplications (projections, LM head);
- ``glue``: elementwise, reduction, norm, RoPE, activation, concatenation, embedding kernels;
- ``copies``: memcpy/memset, copy and fill kernels, the KV-cache write;
- ``other``: the rest (sampling's argmax and sort, ...).

Writes DIR/<engine>_profile_h200.json (``_cpu`` without a GPU): {"device", "date", "command",
"workload", "run": {...whole run...}, "window": {"decode_steps", "mean_batch", "classes": [{"class",
"kernels_per_step", "gpu_us_per_step", "share", "floor_us_per_step" (attention: its KV read at the
copy bandwidth; GEMM: the weights read once)}], "gpu_us_per_step", "wall_us_per_step" and
"host_us_per_step" (both from the decode steps outside the window, which the profiler does not slow
down), "top_kernels": {class: [[name, per step, µs per step], ...]}}}. About 1 minute on an H200 for
the full workload. ``--quick`` runs a tiny model on the CPU (CPU operators stand in for kernels).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.bench_engine import (COPY_BANDWIDTH, build_model, qwen3_06b_config,  # noqa: E402
                                     sync, workload)
from minipaged.memory.sizing import kv_bytes_per_token  # noqa: E402


def base_engine(model, **options):
    """Chapter 12's engine: ``LLMEngine`` with its own parts."""
    from minipaged.engine.llm_engine import LLMEngine

    return LLMEngine(model, **options)


def minipaged_llm(model, **options):
    """The book's ``minipaged.LLM`` (``LLMEngine`` with ``FAST_PARTS``, chapters 14 and 15)."""
    from minipaged.entrypoints.llm import LLM

    return LLM(model, **options)


ENGINES = {"engine": (base_engine, "minipaged.engine.llm_engine.LLMEngine"),
           "fast_engine": (minipaged_llm, "minipaged.entrypoints.llm.LLM")}
"""``--engine`` -> (constructor, the class it builds)"""


def engine_of(llm):
    """The ``LLMEngine`` under ``llm`` (``minipaged.LLM`` is a front end holding one)."""
    return getattr(llm, "llm_engine", llm)


def reset_stats(llm) -> None:
    """Fresh counters for the engine and its model runner (which adds to the same ones)."""
    from minipaged.engine.llm_engine import RunStats

    engine = engine_of(llm)
    engine.stats = engine.runner.stats = RunStats()


CLASSES = ("attention", "GEMM", "glue", "copies", "other")
_RULES = (  # first match wins; names lowercased
    ("copies", ("memcpy", "memset", "_write_kv", "copy_kernel", "direct_copy", "fill",
                "aten::copy_", "aten::fill_", "aten::to", "aten::_to_copy")),
    ("attention", ("paged_decode", "decode_kernel", "merge_splits", "flash", "fmha", "attention",
                   "sdpa", "attend")),
    ("GEMM", ("gemm", "gemv", "cutlass", "nvjet", "xmma", "cublas", "splitk", "matmul",
              "aten::mm", "aten::addmm", "aten::linear", "aten::bmm")),
    ("glue", ("rms_norm", "qk_norm_rope", "silu", "elementwise", "vectorized", "reduce", "cat",
              "embedding", "aten::mul", "aten::add", "aten::pow", "aten::mean", "aten::rsqrt",
              "aten::neg", "aten::cos", "aten::sin")),
)


def kernel_class(name: str) -> str:
    lower = name.lower()
    for cls, keys in _RULES:
        if any(k in lower for k in keys):
            return cls
    return "other"


def device_events(prof, on_gpu: bool) -> list[tuple[str, float]]:
    """(name, microseconds) of every GPU kernel/memcpy/memset (on the CPU: every aten op, self time)."""
    from torch.autograd import DeviceType

    out = []
    for evt in prof.events():
        if on_gpu and evt.device_type == DeviceType.CUDA:
            out.append((evt.name, evt.time_range.elapsed_us()))
        elif not on_gpu and evt.name.startswith("aten::"):
            out.append((evt.name, evt.self_cpu_time_total))
    return out


def summarise(events, steps: int, floors: dict) -> dict:
    count, time_us, names = defaultdict(int), defaultdict(float), defaultdict(lambda: [0, 0.0])
    for name, us in events:
        cls = kernel_class(name)
        count[cls] += 1
        time_us[cls] += us
        names[(cls, name)][0] += 1
        names[(cls, name)][1] += us
    total = sum(time_us.values()) or 1.0
    classes = []
    for cls in CLASSES:
        row = {"class": cls, "kernels_per_step": count[cls] / steps,
               "gpu_us_per_step": time_us[cls] / steps, "share": time_us[cls] / total}
        if cls in floors:
            row["floor_us_per_step"] = floors[cls]
        classes.append(row)
    top = {}
    for cls in CLASSES:
        rows = sorted(((n, c / steps, us / steps) for (k, n), (c, us) in names.items() if k == cls),
                      key=lambda r: -r[2])[:8]
        top[cls] = [[n[:120], round(c, 2), round(us, 2)] for n, c, us in rows]
    return {"classes": classes, "gpu_us_per_step": total / steps, "top_kernels": top}


def add_run_args(parser, engine: str) -> None:
    """The options both profiles share: output folder, engine, CPU run, workload size."""
    parser.add_argument("--out", default="results")
    parser.add_argument("--engine", choices=list(ENGINES), default=engine)
    parser.add_argument("--quick", action="store_true", help="a tiny model on the CPU")
    parser.add_argument("--num-requests", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=None)


def record_header(engine: str, num_requests: int, prompt_len, max_tokens: int, dtype) -> dict:
    """The fields every profile record starts with: device, date, command, workload."""
    on_gpu = torch.cuda.is_available()
    return {
        "device": torch.cuda.get_device_name() if on_gpu else "cpu",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join(sys.argv),
        "engine": ENGINES[engine][1],
        "versions": {"torch": torch.__version__},
        "workload": {"requests": num_requests, "prompt_len": list(prompt_len),
                     "max_tokens": max_tokens, "ignore_eos": True, "greedy": True,
                     "dtype": str(dtype)}}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_args(parser, "engine")
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--window", type=int, default=None, help="decode steps profiled (32)")
    parser.add_argument("--settle", type=int, default=None,
                        help="decode steps after the last admission before the window (16)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    on_gpu = torch.cuda.is_available()
    device = "cuda" if on_gpu else "cpu"
    quick = args.quick or not on_gpu
    num_requests = args.num_requests or (8 if quick else 256)
    max_tokens = args.max_tokens or (24 if quick else 512)
    lo, hi = (16, 64) if quick and not on_gpu else (100, 1024)
    window = args.window or (4 if quick else 32)
    settle = args.settle if args.settle is not None else (2 if quick else 16)
    dtype = torch.bfloat16 if on_gpu else torch.float32

    from minipaged.engine.scheduler import SamplingParams

    build = ENGINES[args.engine][0]
    config = qwen3_06b_config(quick and not on_gpu)
    model = build_model(config, device, dtype)
    prompts = workload(num_requests, lo, hi, config.vocab_size)
    llm = build(model, block_size=16, max_num_seqs=args.max_num_seqs)
    llm.generate([[1 + i] * 32 for i in range(4)], SamplingParams(temperature=0.0, max_tokens=4),
                 use_tqdm=False)  # warm-up: kernels compiled, graphs captured
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    reset_stats(llm)
    for p in prompts:
        llm.add_request(p, params)

    activities = [torch.profiler.ProfilerActivity.CPU]
    if on_gpu:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    prof = torch.profiler.profile(activities=activities)
    steps, profiled, decode_since_admission = [], 0, 0
    kv_in_window = tokens_in_window = 0
    sync()
    start = time.perf_counter()
    while llm.has_unfinished_requests():
        s = llm.stats
        before = (s.prefill_tokens, s.schedule_seconds, s.output_tokens, s.kv_tokens_read)
        decode_phase = not llm.scheduler.waiting
        in_window = decode_phase and decode_since_admission >= settle and profiled < window
        if in_window and profiled == 0:
            prof.start()
        t0 = time.perf_counter()
        llm.step()
        sync()
        wall = time.perf_counter() - t0
        is_prefill = s.prefill_tokens > before[0]
        if in_window:
            profiled += 1
            kv_in_window += s.kv_tokens_read - before[3]
            tokens_in_window += s.output_tokens - before[2]
            if profiled == window or not llm.has_unfinished_requests():
                prof.stop()
        decode_since_admission += decode_phase and not is_prefill
        steps.append({"wall": wall, "host": s.schedule_seconds - before[1], "prefill": is_prefill,
                      "profiled": in_window})
    seconds = time.perf_counter() - start
    if profiled == 0:
        print("no decode step was profiled: the run is too short for --settle/--window", file=sys.stderr)
        return 1

    weight_bytes = sum(p.numel() * p.element_size() for p in llm.model.parameters())
    kv_per_token = kv_bytes_per_token(config.num_hidden_layers, config.num_key_value_heads,
                                      config.head_dim, llm.cache.storage.element_size())
    floors = {"attention": 1e6 * kv_in_window * kv_per_token / COPY_BANDWIDTH / profiled,
              "GEMM": 1e6 * weight_bytes / COPY_BANDWIDTH}
    summary = summarise(device_events(prof, on_gpu), profiled, floors)
    plain = [st for st in steps if not st["prefill"] and not st["profiled"]]
    prefill = [st for st in steps if st["prefill"]]
    summary.update(
        decode_steps=profiled, mean_batch=tokens_in_window / profiled,
        wall_us_per_step=1e6 * statistics.mean(st["wall"] for st in plain) if plain else None,
        host_us_per_step=1e6 * statistics.mean(st["host"] for st in plain) if plain else None)
    if not on_gpu:  # CPU operators nest: their self times are the CPU's whole step
        summary["note"] = "CPU run: aten operators (self time) stand in for GPU kernels"
    output_tokens = llm.stats.output_tokens
    result = record_header(args.engine, num_requests, (lo, hi), max_tokens, dtype)
    result["workload"]["model"] = ("random Qwen3-0.6B shape" if config.num_hidden_layers == 28
                                   else "tiny")
    result.update({
        "copy_bandwidth_bytes_per_s": COPY_BANDWIDTH,
        "run": {"seconds": seconds, "output_tokens": output_tokens,
                "tok_per_s_with_window": output_tokens / seconds, "steps": len(steps),
                "prefill_steps": len(prefill), "prefill_seconds": sum(st["wall"] for st in prefill),
                "decode_steps_unprofiled": len(plain),
                "decode_seconds_unprofiled": sum(st["wall"] for st in plain),
                "host_seconds": sum(st["host"] for st in steps), "graph_steps": llm.stats.graph_steps},
        "window": summary,
    })
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{args.engine}_profile_{'h200' if on_gpu else 'cpu'}.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"{'class':<10} {'kernels/step':>13} {'µs/step':>10} {'floor µs':>9} {'share':>6}")
    for row in summary["classes"]:
        floor = row.get("floor_us_per_step")
        print(f"{row['class']:<10} {row['kernels_per_step']:>13.1f} {row['gpu_us_per_step']:>10.1f} "
              f"{'' if floor is None else f'{floor:.1f}':>9} {row['share']:>6.0%}")
    host = summary["host_us_per_step"]
    print(f"decode step: wall {summary['wall_us_per_step'] or 0:.0f} µs, host {host or 0:.0f} µs, "
          f"mean batch {summary['mean_batch']:.0f}; whole run {seconds:.1f} s -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
