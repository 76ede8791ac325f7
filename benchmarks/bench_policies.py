"""Scheduler choices in wall-clock time: preemption by recompute vs swap, decode-first vs prefill-first.

    python benchmarks/bench_policies.py --out DIR [--quick]

Chapter 10 compares these choices in scheduler steps on a toy workload; this script times them on the
real engine, on the Qwen3-0.6B shape with random bf16 weights (a tiny model on CPU), one process, one
model, one workload (prompts uniform in 100-1024 tokens, ``--max-tokens`` new tokens, EOS ignored):

- ``preemption``: all requests at once (offline ``generate``) on a cache of ``--tight-blocks`` blocks,
  far too small for them all, once with ``preemption_mode="recompute"`` and once with ``"swap"``;
  and once on a cache sized from free memory, where nobody is preempted, as the reference.
- ``arrivals``: requests arrive as a Poisson process of ``--rate`` requests/s and are added to the
  engine as they arrive (``add_request`` + ``step``), once with ``policy="decode_first"`` and once
  with ``"prefill_first"``. Time to first token (TTFT) and the longest step a running request waited
  for its next token tell the two apart.

Writes DIR/policies.json: {"device", "date", "command", "rows": [...]}.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import build_model, qwen3_06b_config, sync, workload  # noqa: E402


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


def new_engine(model, **options):
    from minipaged import SamplingParams
    from minipaged.engine.llm_engine import LLMEngine  # chapter 12's engine, whose policies chapter 10 compares

    llm = LLMEngine(model, block_size=16, **options)
    llm.generate([[1 + i] * 32 for i in range(4)], SamplingParams(temperature=0.0, max_tokens=4),
                 use_tqdm=False)  # warm-up: kernels compiled, graphs captured
    sync()
    return llm


def latency_summary(stats) -> dict:
    return {"mean_ttft_s": stats.summary()["mean_ttft_s"], "p90_ttft_s": percentile(stats.ttft, 0.9),
            "mean_tpot_s": stats.summary()["mean_tpot_s"], "p90_tpot_s": percentile(stats.tpot, 0.9)}


def run_offline(model, prompts, max_tokens, label, **options) -> dict:
    from minipaged import SamplingParams

    llm = new_engine(model, **options)
    sync()
    start = time.perf_counter()
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
                           use_tqdm=False)
    sync()
    seconds = time.perf_counter() - start
    stats = llm.last_run_stats()
    row = {"experiment": "preemption", "run": label, "num_blocks": llm.cache.num_blocks,
           "seconds": seconds, "tok_per_s": stats["output_tokens"] / seconds,
           "preemptions": stats["preemptions"], "steps": stats["steps"],
           "prefill_tokens": stats["prefill_tokens"], "prompt_tokens": sum(map(len, prompts)),
           "prefix_hit_rate": stats["prefix_hit_rate"], **latency_summary(llm.stats),
           "tokens": [o.outputs[0].token_ids for o in outputs]}
    del llm, outputs
    gc.collect()
    return row


def run_arrivals(model, prompts, max_tokens, rate, policy) -> dict:
    """Add each request at its Poisson arrival time and step the engine until all are done."""
    from minipaged import SamplingParams

    llm = new_engine(model, policy=policy)
    llm.stats = llm.runner.stats = type(llm.stats)()  # the runner adds to the same counters
    rng = random.Random(7)
    arrivals, t = [], 0.0
    for _ in prompts:
        t += rng.expovariate(rate)
        arrivals.append(t)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    step_seconds, next_request = [], 0
    start = time.perf_counter()
    while next_request < len(prompts) or llm.has_unfinished_requests():
        now = time.perf_counter() - start
        while next_request < len(prompts) and arrivals[next_request] <= now:
            llm.add_request(prompts[next_request], params)
            next_request += 1
        if not llm.has_unfinished_requests():
            time.sleep(min(0.001, arrivals[next_request] - now))
            continue
        t0 = time.perf_counter()
        llm.step()
        sync()
        step_seconds.append(time.perf_counter() - t0)
    seconds = time.perf_counter() - start
    stats = llm.stats
    row = {"experiment": "arrivals", "run": policy, "rate_per_s": rate, "seconds": seconds,
           "tok_per_s": stats.output_tokens / seconds, "steps": stats.steps,
           "preemptions": stats.preemptions, **latency_summary(stats),
           "p99_step_s": percentile(step_seconds, 0.99), "max_step_s": max(step_seconds)}
    del llm
    gc.collect()
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results", help="folder for policies.json")
    parser.add_argument("--quick", action="store_true", help="a small workload (and tiny model on CPU)")
    parser.add_argument("--num-requests", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--tight-blocks", type=int, default=None,
                        help="blocks of 16 tokens for the preemption runs (default: about a third of "
                             "what the workload needs at its peak)")
    parser.add_argument("--rate", type=float, default=None, help="arrivals per second")
    parser.add_argument("--experiments", default="preemption,arrivals",
                        help="comma-separated: preemption, arrivals")
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tiny = args.quick and device == "cpu"
    num_requests = args.num_requests or (12 if tiny else 256)
    max_tokens = args.max_tokens or (16 if tiny else 256)
    lo, hi = (16, 64) if tiny else (100, 1024)
    config = qwen3_06b_config(args.quick)
    model = build_model(config, device, torch.bfloat16 if device == "cuda" else torch.float32)
    prompts = workload(num_requests, lo, hi, config.vocab_size, seed=2)
    peak_blocks = sum(-(-(len(p) + max_tokens) // 16) for p in prompts)
    tight = args.tight_blocks or max(peak_blocks // 3, -(-(hi + max_tokens) // 16) + 1)
    rate = args.rate or (2.0 if tiny else 40.0)

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "command": "python " + " ".join(sys.argv),
              "versions": {"torch": torch.__version__},
              "workload": {"requests": num_requests, "prompt_len": [lo, hi], "max_tokens": max_tokens,
                           "block_size": 16, "peak_blocks_if_all_ran_at_once": peak_blocks,
                           "model": "tiny" if tiny else "random Qwen3-0.6B shape",
                           "dtype": "float32" if device == "cpu" else "bfloat16"},
              "rows": []}

    def record(row):
        tokens = row.pop("tokens", None)
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
        (out_dir / "policies.json").write_text(json.dumps(result, indent=1))
        return tokens

    experiments = args.experiments.split(",")
    if "preemption" in experiments:
        reference = record(run_offline(model, prompts, max_tokens, "no preemption (cache from free memory)",
                                       num_blocks=None if device == "cuda" else peak_blocks))
        for mode in ("recompute", "swap"):
            row = run_offline(model, prompts, max_tokens, f"{mode}, {tight} blocks", num_blocks=tight,
                              preemption_mode=mode)
            # in fp32 these are all equal (chapter 12 checks it); in bf16 a different batch or a
            # recomputed prefill can flip a near-tie of random weights
            row["requests_identical_to_reference"] = sum(a == b for a, b in zip(row["tokens"], reference))
            record(row)
    if "arrivals" in experiments:
        for policy in ("decode_first", "prefill_first"):
            record(run_arrivals(model, prompts, max_tokens, rate, policy))
    return 0


if __name__ == "__main__":
    sys.exit(main())
