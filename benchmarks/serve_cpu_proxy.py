"""What the server costs on a CPU, where its host work dominates: a tiny random Qwen3, the same
requests in process and through the server, with the engine owned by a thread of the server's
process (the design before the engine core moved out) and by an engine core process.

    python benchmarks/serve_cpu_proxy.py --out results [--num-requests 128] [--max-tokens 128]
        [--max-num-seqs 128] [--before-src DIR] [--repeats 2] [--device-ms D]
        [--result-name NAME]

(a) In process: ``minipaged.LLM.generate`` on the tiny model (2 layers, hidden 64, vocab 512),
    prompts of 16-64 random token ids, ``--max-tokens`` new tokens each, EOS ignored, greedy.
(b) Served: the same engine options behind ``create_app`` and uvicorn in a child process on
    127.0.0.1, the same prompts sent at once (at most ``--max-num-seqs`` in flight) by
    ``serve_load.run_load`` from this process, once per owner of the engine: ``thread``
    (an ``EngineLoop`` in the server's process) and ``process`` (an engine core process).
    ``--device-ms D`` makes every forward also wait D ms without holding the interpreter, as a
    host waits for a GPU's kernels: the case the engine core process is for.
    ``--before-src DIR`` adds a run of another checkout's package (``DIR/minipaged``, for
    instance the commit before the change, from ``git archive``), served as that code serves.

Every server variant runs ``--repeats`` times, interleaved, and the JSON keeps every run. The
tiny model's step takes a few milliseconds on a CPU, as the 0.6B model's does on an H200: the
server's per-step host work then weighs as much as it does there. On a CPU, though, the client,
the server and the core share the machine's cores, which a GPU host does not: read the ratios,
not the absolute numbers.

Writes OUT/serve_cpu_proxy.json with device, date and command.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def build_llm(max_num_seqs: int, device_ms: float = 0.0):
    """The tiny engine; with ``device_ms``, every forward also waits that long without
    holding the interpreter (``time.sleep``), as a host waits for a GPU's kernels."""
    import torch
    from minipaged.entrypoints.llm import LLM
    from minipaged.model.qwen3 import random_qwen3, tiny_qwen3_config
    model = random_qwen3(tiny_qwen3_config(), seed=0, dtype=torch.float32)
    llm = LLM(model, block_size=16, num_blocks=4096, max_num_seqs=max_num_seqs,
              max_model_len=512)
    if device_ms:
        paged = llm.llm_engine.model  # the model the engine's runner calls once a step
        compute = paged.forward

        def forward(*args, **kwargs):
            out = compute(*args, **kwargs)
            time.sleep(device_ms / 1e3)
            return out

        paged.forward = forward
    return llm


def prompts_of(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 512) for _ in range(rng.randrange(16, 65))] for _ in range(n)]


def serve_child(mode: str, port: int, max_num_seqs: int, device_ms: float) -> None:
    """The server: ``create_app`` on uvicorn, the engine owned as ``mode`` says."""
    import uvicorn
    from minipaged.entrypoints.openai_server import create_app
    import minipaged
    print("package:", minipaged.__file__, flush=True)
    kw = {} if mode == "before" else {"engine_core": mode}
    app = create_app(build_llm(max_num_seqs, device_ms), model_name="tiny", max_waiting=None,
                     **kw)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def in_process(prompts, max_tokens: int, max_num_seqs: int, device_ms: float) -> dict:
    from minipaged.engine.scheduler import SamplingParams
    llm = build_llm(max_num_seqs, device_ms)
    llm.generate(prompts[:4], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
                 use_tqdm=False)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    tpots = [(o.metrics["finish_time"] - o.metrics["first_token_time"]) / (max_tokens - 1)
             for o in outputs]
    return {"output_tokens": tokens, "seconds": seconds, "tok_per_s": tokens / seconds,
            "p50_tpot_ms": 1e3 * statistics.median(tpots)}


def served(mode: str, prompts, max_tokens: int, max_num_seqs: int, src: Path,
           device_ms: float) -> dict:
    from benchmarks.serve_load import LoadRequest, run_load
    from tests.serving import free_port
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{src}{os.pathsep}{ROOT}",
           "PROXY_SRC": str(src)}
    child = subprocess.Popen([sys.executable, __file__, "--serve-child", mode, "--port",
                              str(port), "--max-num-seqs", str(max_num_seqs),
                              "--device-ms", str(device_ms)],
                             env=env, cwd=src, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        import httpx
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert child.poll() is None, child.stdout.read()
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.2)
        requests = [LoadRequest(p, len(p), max_tokens) for p in prompts]
        asyncio.run(run_load(url, requests[:4], model="tiny"))  # warm up
        run = asyncio.run(run_load(url, requests, max_concurrency=max_num_seqs, model="tiny",
                                   timeout=600))
    finally:
        child.terminate()
        out, _ = child.communicate(timeout=60)
    assert run["completed"] == len(prompts), run
    keep = ("duration_s", "output_throughput", "client_cpu_s", "ttft_ms", "tpot_ms", "itl_ms")
    return {"mode": mode, "package": out.split("package: ", 1)[-1].split("\n", 1)[0],
            **{k: run[k] for k in keep}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="results")
    parser.add_argument("--num-requests", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--max-num-seqs", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device-ms", type=float, default=0.0,
                        help="a GPU's share of each step, waited for without the GIL")
    parser.add_argument("--before-src", help="a checkout whose minipaged/ is served as 'before'")
    parser.add_argument("--result-name", default="serve_cpu_proxy.json")
    parser.add_argument("--serve-child", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_child:
        sys.path.insert(0, os.environ["PROXY_SRC"])  # the package under test comes first
        serve_child(args.serve_child, args.port, args.max_num_seqs, args.device_ms)
        return 0
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    prompts = prompts_of(args.num_requests)
    result = {
        "device": f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python benchmarks/serve_cpu_proxy.py " + " ".join(sys.argv[1:]),
        "workload": {"model": "random tiny Qwen3 (2 layers, hidden 64, vocab 512), fp32",
                     "requests": args.num_requests, "prompt_len": [16, 64],
                     "max_tokens": args.max_tokens, "max_concurrency": args.max_num_seqs,
                     "device_ms_per_forward": args.device_ms, "greedy": True,
                     "ignore_eos": True},
        "load_average_1min": os.getloadavg()[0],
        "inprocess": in_process(prompts, args.max_tokens, args.max_num_seqs, args.device_ms),
        "served": []}
    variants = [("thread", ROOT), ("process", ROOT)]
    if args.before_src:
        variants.insert(0, ("before", Path(args.before_src).resolve()))
    for _ in range(args.repeats):
        for mode, src in variants:
            load_before = os.getloadavg()[0]
            run = served(mode, prompts, args.max_tokens, args.max_num_seqs, src, args.device_ms)
            run["load_average_1min"] = [load_before, os.getloadavg()[0]]  # a shared machine
            run["ratio_to_inprocess"] = run["output_throughput"] / result["inprocess"]["tok_per_s"]
            print(f"{mode:8s} {run['output_throughput']:8,.0f} tok/s "
                  f"({run['ratio_to_inprocess']:.0%} of in-process), ITL p50 "
                  f"{run['itl_ms']['median']:.1f} ms", flush=True)
            result["served"].append(run)
    print(f"in process {result['inprocess']['tok_per_s']:8,.0f} tok/s, TPOT p50 "
          f"{result['inprocess']['p50_tpot_ms']:.1f} ms")
    out = Path(args.out) / args.result_name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print("wrote", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
