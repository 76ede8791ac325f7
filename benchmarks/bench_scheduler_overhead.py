"""CPU cost per decode step of the scheduler and the block manager at 256 running sequences.

    python benchmarks/bench_scheduler_overhead.py [--out DIR] [--seqs 256] [--steps 200]

No model runs: each step is what the engine does on the host around the forward, with a stand-in
sampler: ``schedule()`` (which calls the manager's ``reserve_step``), the batch's block-table tensor,
and ``commit()`` (``commit_step`` plus the prefix cache's token bookkeeping). Prints the median per
step and where the time goes (a cProfile of the same steps), and writes
DIR/scheduler_overhead_cpu.json with {"device", "date", "command", ...}.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import json
import platform
import pstats
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from minipaged.prefix_cache import PrefixCachingBlockManager  # noqa: E402
from minipaged.scheduler import SamplingParams, Scheduler, SchedulerConfig, Sequence  # noqa: E402


def setup(num_seqs: int, block_size: int, prefix_caching: bool, seed: int = 0) -> Scheduler:
    """A scheduler with ``num_seqs`` running sequences (prompts of 100-1024 tokens, prefilled)."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(150_000) for _ in range(rng.randint(100, 1024))] for _ in range(num_seqs)]
    blocks = sum(-(-(len(p) + 2048) // block_size) for p in prompts)
    manager = PrefixCachingBlockManager(blocks, block_size, enable_prefix_caching=prefix_caching)
    scheduler = Scheduler(manager, SchedulerConfig(max_num_seqs=num_seqs, max_num_batched_tokens=1 << 20,
                                                   max_model_len=8192))
    for i, prompt in enumerate(prompts):
        scheduler.add(Sequence(i, i, prompt, SamplingParams(max_tokens=100_000, ignore_eos=True)))
    while scheduler.waiting or any(s.num_uncomputed_tokens > 1 for s in scheduler.running):
        out = scheduler.schedule()
        scheduler.commit(out, {c.seq.seq_id: 1 for c in out.chunks if c.samples})
    assert len(scheduler.running) == num_seqs
    return scheduler


def one_step(scheduler: Scheduler, token: int, parts: dict[str, list[float]]) -> None:
    t0 = time.perf_counter()
    out = scheduler.schedule()
    t1 = time.perf_counter()
    scheduler.manager.get_block_table_tensor([c.seq.seq_id for c in out.chunks])
    t2 = time.perf_counter()
    scheduler.commit(out, {c.seq.seq_id: token for c in out.chunks if c.samples})
    t3 = time.perf_counter()
    parts["schedule (incl. reserve_step)"].append(t1 - t0)
    parts["block table tensor"].append(t2 - t1)
    parts["commit (incl. commit_step)"].append(t3 - t2)
    parts["total"].append(t3 - t0)


def measure(num_seqs: int, steps: int, block_size: int, prefix_caching: bool) -> dict:
    scheduler = setup(num_seqs, block_size, prefix_caching)
    parts: dict[str, list[float]] = {k: [] for k in (
        "schedule (incl. reserve_step)", "block table tensor", "commit (incl. commit_step)", "total")}
    rng = random.Random(1)
    for _ in range(10):  # warm-up
        one_step(scheduler, rng.randrange(150_000), {k: [] for k in parts})
    for _ in range(steps):
        one_step(scheduler, rng.randrange(150_000), parts)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(50):
        one_step(scheduler, rng.randrange(150_000), {k: [] for k in parts})
    profile.disable()
    stats = pstats.Stats(profile)
    top = sorted(((v[2] / 50, f"{Path(k[0]).name}:{k[1]}({k[2]})")
                  for k, v in stats.stats.items()), reverse=True)[:12]
    return {"num_seqs": num_seqs, "block_size": block_size, "prefix_caching": prefix_caching,
            "steps": steps,
            "median_ms": {k: 1e3 * statistics.median(v) for k, v in parts.items()},
            "p90_ms_total": 1e3 * statistics.quantiles(parts["total"], n=10)[-1],
            "self_time_ms_per_step": [{"function": name, "ms": 1e3 * t} for t, name in top]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results")
    parser.add_argument("--seqs", type=int, default=256)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args()
    rows = [measure(args.seqs, args.steps, args.block_size, caching) for caching in (True, False)]
    for row in rows:
        parts = ", ".join(f"{k} {v:.3f}" for k, v in row["median_ms"].items())
        print(f"{row['num_seqs']} running, prefix caching {row['prefix_caching']}: median ms per step: {parts}")
        for item in row["self_time_ms_per_step"][:6]:
            print(f"    {item['ms']:.3f} ms  {item['function']}")
    result = {"device": f"cpu ({platform.processor() or platform.machine()}, "
                        f"python {platform.python_version()})",
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "command": "python " + " ".join(sys.argv), "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "scheduler_overhead_cpu.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
