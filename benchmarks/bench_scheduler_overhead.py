"""CPU cost per decode step of the scheduler and the block manager at 256 running sequences.

    python benchmarks/bench_scheduler_overhead.py [--out DIR] [--seqs 256] [--steps 200]
                                                  [--baseline GIT_REV] [--rounds 5]

No model runs: each step is what the engine does on the host around the forward, with a stand-in
sampler: ``schedule()`` (which calls the manager's ``reserve_step``), the batch's block-table tensor
(part of the reservation since the reservation carries it; asked of the manager in older versions),
and ``commit()`` (``commit_step`` plus the prefix cache's token bookkeeping). Prints the median per
step and where the time goes (a cProfile of the same steps), and writes
DIR/scheduler_overhead_cpu.json with {"device", "date", "command", ...}.

``--baseline REV`` also measures the package as it was at git revision REV, side by side: the
two versions run in alternating subprocesses (``--rounds`` of each, interleaved, so both see the
same load on a shared machine), and the JSON gets a "comparison" with the median of each variant.
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
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__" and "--package-root" in sys.argv:  # a worker measuring another version
    sys.path.insert(0, sys.argv[sys.argv.index("--package-root") + 1])
else:
    sys.path.insert(0, str(ROOT))

try:
    from minipaged.engine.scheduler import SamplingParams, Scheduler, SchedulerConfig, Sequence
    from minipaged.memory.prefix_cache import PrefixCachingBlockManager
except ModuleNotFoundError:  # a --baseline revision from before the package's layout by layer
    from minipaged.prefix_cache import PrefixCachingBlockManager
    from minipaged.scheduler import SamplingParams, Scheduler, SchedulerConfig, Sequence


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
    if getattr(out.reservation, "block_tables", None) is None:  # older packages: ask the manager
        scheduler.manager.get_block_table_tensor([c.seq.seq_id for c in out.chunks])
    t2 = time.perf_counter()  # (the reservation carries the tables: built inside schedule)
    scheduler.commit(out, {c.seq.seq_id: token for c in out.chunks if c.samples})
    t3 = time.perf_counter()
    parts["schedule (incl. reserve_step)"].append(t1 - t0)
    parts["block table tensor"].append(t2 - t1)
    parts["commit (incl. commit_step)"].append(t3 - t2)
    parts["total"].append(t3 - t0)


def measure(num_seqs: int, steps: int, block_size: int, prefix_caching: bool, profile: bool = True) -> dict:
    scheduler = setup(num_seqs, block_size, prefix_caching)
    parts: dict[str, list[float]] = {k: [] for k in (
        "schedule (incl. reserve_step)", "block table tensor", "commit (incl. commit_step)", "total")}
    rng = random.Random(1)
    for _ in range(10):  # warm-up
        one_step(scheduler, rng.randrange(150_000), {k: [] for k in parts})
    for _ in range(steps):
        one_step(scheduler, rng.randrange(150_000), parts)
    top = []
    if profile:
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(50):
            one_step(scheduler, rng.randrange(150_000), {k: [] for k in parts})
        profiler.disable()
        stats = pstats.Stats(profiler)
        top = sorted(((v[2] / 50, f"{Path(k[0]).name}:{k[1]}({k[2]})")
                      for k, v in stats.stats.items()), reverse=True)[:12]
    return {"num_seqs": num_seqs, "block_size": block_size, "prefix_caching": prefix_caching,
            "steps": steps,
            "median_ms": {k: 1e3 * statistics.median(v) for k, v in parts.items()},
            "p90_ms_total": 1e3 * statistics.quantiles(parts["total"], n=10)[-1],
            "self_time_ms_per_step": [{"function": name, "ms": 1e3 * t} for t, name in top]}


def extract(rev: str, into: Path) -> Path:
    """The ``minipaged`` package as it was at git revision ``rev``, unpacked under ``into``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev, "minipaged"],
                             check=True, capture_output=True).stdout
    with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def compare(args: argparse.Namespace) -> dict:
    """Median per-step totals of the working tree and of ``args.baseline``, interleaved rounds."""
    totals: dict[str, dict[str, list[float]]] = {"baseline": {}, "current": {}}
    with tempfile.TemporaryDirectory() as tmp:
        roots = {"baseline": extract(args.baseline, Path(tmp)), "current": ROOT}
        for _ in range(args.rounds):
            for variant, root in roots.items():
                run = subprocess.run(
                    [sys.executable, __file__, "--worker", "--package-root", str(root), "--seqs",
                     str(args.seqs), "--steps", str(args.steps), "--block-size", str(args.block_size)],
                    check=True, capture_output=True, text=True)
                for row in json.loads(run.stdout):
                    key = f"prefix_caching={row['prefix_caching']}"
                    totals[variant].setdefault(key, []).append(row["median_ms"]["total"])
    return {"baseline_rev": args.baseline,
            "baseline_commit": subprocess.run(["git", "-C", str(ROOT), "rev-parse", args.baseline],
                                              check=True, capture_output=True, text=True).stdout.strip(),
            "rounds": args.rounds,
            "median_ms_total": {v: {k: statistics.median(x) for k, x in rows.items()}
                                for v, rows in totals.items()},
            "round_medians_ms_total": totals}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results")
    parser.add_argument("--seqs", type=int, default=256)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--baseline", help="git revision to measure side by side with the working tree")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--package-root", help=argparse.SUPPRESS)
    args = parser.parse_args()
    rows = [measure(args.seqs, args.steps, args.block_size, caching, profile=not args.worker)
            for caching in (True, False)]
    if args.worker:
        print(json.dumps(rows))
        return 0
    for row in rows:
        parts = ", ".join(f"{k} {v:.3f}" for k, v in row["median_ms"].items())
        print(f"{row['num_seqs']} running, prefix caching {row['prefix_caching']}: median ms per step: {parts}")
        for item in row["self_time_ms_per_step"][:6]:
            print(f"    {item['ms']:.3f} ms  {item['function']}")
    result = {"device": f"cpu ({platform.processor() or platform.machine()}, "
                        f"python {platform.python_version()})",
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "command": "python " + " ".join(sys.argv), "rows": rows}
    if args.baseline:
        result["comparison"] = compare(args)
        for variant, medians in result["comparison"]["median_ms_total"].items():
            print(f"{variant}: median ms per step over {args.rounds} interleaved rounds: "
                  + ", ".join(f"{k} {v:.3f}" for k, v in medians.items()))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "scheduler_overhead_cpu.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
