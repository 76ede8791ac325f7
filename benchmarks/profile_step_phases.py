"""Where the host time of a decode step goes: each phase of ``step()`` timed, on the course workload.

    python benchmarks/profile_step_phases.py [--out DIR] [--engine engine|fast_engine] [--quick]
                                             [--num-requests N] [--max-tokens N]

Runs the package's engine (``--engine fast_engine``, the default: ``minipaged.LLM``) or chapter 12's
(``--engine engine``: ``minipaged.engine.llm_engine.LLMEngine``) on bench_engine.py's model and workload (random
bf16 Qwen3-0.6B shape, prompts uniform in 100-1024, 512 new tokens, EOS ignored, greedy) and wraps the
methods of the engine's scheduler and model runner (``engine.runner``) with timers
(``time.perf_counter``). A step's phases, in the order they run:

- ``schedule``: ``Scheduler.schedule()`` (with the block manager's ``reserve_step``);
- ``move blocks``: swaps and copy-on-write copies;
- ``build batch``: the step's host tensors (token ids, ``ForwardBatch.from_reservation``: the
  runner's ``run_group``);
- ``launch``: ``DecodeGraphs.run`` (copies into the graph's buffers and the replay) or the eager
  forward's launches;
- ``wait for GPU``: a ``torch.cuda.synchronize()`` added at the start of the runner's ``sample``: the
  time the host waits for the step's kernels (the engine would wait as long in ``tolist()``);
- ``sample``: the runner's ``sample`` after that (sampling kernels and the read-back of the tokens);
- ``commit``: ``Scheduler.commit()`` (tokens appended, finished sequences freed);
- ``rest``: what the step spends outside these (bookkeeping, outputs).

Everything except ``wait for GPU`` is time in which the GPU has nothing queued (the engine reads
its tokens back at every step), so their sum is the step's idle GPU time. Only decode steps after
the last admission are counted. ``minipaged.LLM`` is measured with ``overlap_scheduling=False``
(the phases of a synchronous step), then served again as it is by default, with the host's work of
a step overlapped with the GPU's, uninstrumented: ``overlapped_wall_ms_per_step``. Writes
DIR/step_phases_<engine>_h200.json (``_cpu`` without a GPU): {"device", "date", "command",
"workload", "decode_steps", "mean_batch", "ms_per_step": {phase: mean}, "host_ms_per_step",
"wall_ms_per_step", "overlapped_wall_ms_per_step"}. About two minutes on an H200.

``--stub`` replaces the model's forwards with zero logits (a tiny model's vocabulary) and serves 256
requests of 64 new tokens: the host's work per step at the real batch, on any machine, both with and
without the overlap; its file is DIR/step_phases_<engine>_stub.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.bench_engine import build_model, qwen3_06b_config, sync, workload  # noqa: E402
from benchmarks.profile_engine import ENGINES, add_run_args, engine_of, record_header  # noqa: E402

PHASES = ("schedule", "move blocks", "build batch", "launch", "wait for GPU", "sample", "commit",
          "rest")


class PhaseTimer:
    """Adds each wrapped call's seconds to the current step's phase."""

    def __init__(self):
        self.step = defaultdict(float)

    def wrap(self, phase, fn, before=None):
        def timed(*args, **kwargs):
            if before is not None:
                before()
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.step[phase] += time.perf_counter() - t0
        return timed


def instrument(llm, timer: PhaseTimer) -> None:
    """Wrap the phases of ``llm``'s engine with ``timer`` (instance attributes of its scheduler
    and model runner: the classes are untouched). For a synchronous step loop (chapter 12's
    ``StepLoop``, which samples through ``runner.sample``)."""
    engine = engine_of(llm)
    scheduler, runner = engine.scheduler, engine.runner
    scheduler.schedule = timer.wrap("schedule", scheduler.schedule)
    scheduler.commit = timer.wrap("commit", scheduler.commit)
    runner.move_blocks = timer.wrap("move blocks", runner.move_blocks)
    runner.run_group = timer.wrap("build batch", runner.run_group)  # launch is subtracted below
    runner.model = _LaunchTimed(runner.model, timer)  # the model the runner's forwards call
    graphs = runner.decode_graphs() if runner.enable_cuda_graphs else None
    if graphs is not None:
        graphs.run = timer.wrap("launch", graphs.run)
    def wait():
        t0 = time.perf_counter()
        sync()
        timer.step["wait for GPU"] += time.perf_counter() - t0
    runner.sample = timer.wrap("sample", runner.sample, before=wait)


class _LaunchTimed(torch.nn.Module):
    """The model, with its eager forwards timed as ``launch``."""

    def __init__(self, model, timer):
        super().__init__()
        self.inner, self.timer = model, timer

    def forward(self, *args, **kwargs):
        return self.timer.wrap("launch", self.inner)(*args, **kwargs)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("inner"), name)


def decode_step_walls(llm, prompts, params, timer: PhaseTimer | None) -> list:
    """Serve ``prompts``; per decode step after the last admission: (seconds, phases, batch)."""
    from minipaged.engine.scheduler import SamplingParams

    llm.generate([[1 + i] * 32 for i in range(4)], SamplingParams(temperature=0.0, max_tokens=4),
                 use_tqdm=False)  # warm-up: kernels compiled, graphs captured
    if timer is not None:
        instrument(llm, timer)
    for p in prompts:
        llm.add_request(p, params)
    steps = []
    sync()
    while llm.has_unfinished_requests():
        decode_phase = not llm.scheduler.waiting
        prefill_before = llm.stats.prefill_tokens
        if timer is not None:
            timer.step.clear()
        t0 = time.perf_counter()
        llm.step()
        wall = time.perf_counter() - t0
        if decode_phase and llm.stats.prefill_tokens == prefill_before:
            steps.append((wall, defaultdict(float, timer.step if timer else {}),
                          len(llm.scheduler.running)))
    sync()
    return steps


def stubbed(llm, args):
    """``llm`` with its forwards replaced by zero logits under ``--stub``: the engine's host
    work alone, at the real workload's batch, on any machine."""
    if args.stub:
        runner = engine_of(llm).runner
        vocab = llm.model.config.vocab_size

        def zero_logits(rows):
            return torch.zeros(rows, vocab)

        # run_batch serves the overlapped loop's decodes (runner.decode), run_group the rest
        runner.run_batch = lambda batch: zero_logits(len(batch.logits_indices))
        runner.run_group = lambda chunks, res, rows: zero_logits(sum(c.samples for c in chunks))
    return llm


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_args(parser, "fast_engine")
    parser.add_argument("--stub", action="store_true",
                        help="zero logits instead of the model: the host's work alone")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    on_gpu = torch.cuda.is_available() and not args.stub
    quick = (args.quick or not on_gpu) and not args.stub
    num_requests = args.num_requests or (8 if quick else 256)
    max_tokens = args.max_tokens or (24 if quick else 64 if args.stub else 512)
    lo, hi = (16, 64) if quick else (100, 1024)
    dtype = torch.bfloat16 if on_gpu else torch.float32

    from minipaged.engine.scheduler import SamplingParams

    build = ENGINES[args.engine][0]
    if args.stub:  # only the vocabulary matters: the forward never runs
        from minipaged.model.qwen3 import tiny_qwen3_config
        config = tiny_qwen3_config(max_position_embeddings=4096)
    else:
        config = qwen3_06b_config(quick and not on_gpu)
    model = build_model(config, "cuda" if on_gpu else "cpu", dtype)
    prompts = workload(num_requests, lo, hi, config.vocab_size)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    overlap = {"overlap_scheduling": False} if args.engine == "fast_engine" else {}
    sizing = {"num_blocks": 40_000} if args.stub else {}
    llm = stubbed(build(model, block_size=16, max_num_seqs=256, **overlap, **sizing), args)
    timer = PhaseTimer()
    totals, walls, rows = defaultdict(float), decode_step_walls(llm, prompts, params, timer), 0
    for wall, phases, batch in walls:
        phases["build batch"] -= phases["launch"]
        phases["rest"] = wall - sum(phases[p] for p in PHASES if p != "rest")
        for p in PHASES:
            totals[p] += phases[p]
        rows += batch
    steps = len(walls)
    if steps == 0:
        print("no decode step after the last admission: the run is too short", file=sys.stderr)
        return 1
    ms = {p: 1e3 * totals[p] / steps for p in PHASES}
    overlapped = None
    if overlap:  # the same steps with the host's work overlapped, not instrumented
        del llm
        gc.collect()  # the first engine's cache goes before the second's is sized
        if on_gpu:
            torch.cuda.empty_cache()
        llm = stubbed(build(model, block_size=16, max_num_seqs=256, **sizing), args)
        walls_overlapped = decode_step_walls(llm, prompts, params, None)
        overlapped = 1e3 * sum(w for w, _, _ in walls_overlapped) / len(walls_overlapped)
    result = record_header(args.engine, num_requests, (lo, hi), max_tokens, dtype)
    result.update({
        "decode_steps": steps, "mean_batch": rows / steps, "ms_per_step": ms,
        "host_ms_per_step": sum(v for p, v in ms.items() if p != "wait for GPU"),
        "wall_ms_per_step": 1e3 * sum(w for w, _, _ in walls) / steps,
        "overlapped_wall_ms_per_step": overlapped,
    })
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    where = "stub" if args.stub else "h200" if on_gpu else "cpu"
    path = out / f"step_phases_{args.engine}_{where}.json"
    path.write_text(json.dumps(result, indent=1))
    for p in PHASES:
        print(f"{p:<13} {ms[p]:8.3f} ms/step")
    print(f"decode step {result['wall_ms_per_step']:.3f} ms, host {result['host_ms_per_step']:.3f} ms,"
          f" {steps} steps, mean batch {result['mean_batch']:.0f} -> {path}")
    if overlapped is not None:
        print(f"decode step with the host's work overlapped: {overlapped:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
