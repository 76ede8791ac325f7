"""The course workload in-process and through ``minipaged serve``: what the server costs, and the
highest request rate it sustains within latency limits.

    python benchmarks/serve_vs_inprocess.py --out results [--model-spec random:qwen3-0.6b]
        [--num-requests 256] [--max-tokens 512] [--rates R1,R2,...] [--sweep-requests N]
        [--base-url URL] [--skip-inprocess] [--run-timeout S] [--client-processes K]
        [--budgets B1,B2,... [--budget-rate R]] [--skip-served] [--result-name NAME]
        [--api-server-counts N1,N2,...]

(a) In-process: ``minipaged.LLM.generate`` on bench_fast_engine's model and workload
    (random bf16 Qwen3-0.6B shape, 256 requests, prompts uniform in 100-1024, 512 new tokens, EOS
    ignored, greedy), in a child process (``bench_fast_engine.run_engine_in_child``): output tokens/s
    and p50 TPOT.
(b) Served: the same engine options behind ``python -m minipaged serve`` on 127.0.0.1 (a
    subprocess; ``server_command`` is the one place that knows its command line), the same token-id
    prompts sent by ``serve_load.run_load`` all at once with at most 256 in flight: output tokens/s,
    p50 ITL and p50 TPOT.
(c) A sweep of request rates (Poisson arrivals; by default fractions of (b)'s request throughput,
    ``SWEEP_FRACTIONS``, up to past saturation): per rate the load generator's metrics, and the
    highest rate whose p99 TTFT <= 1 s and p99 TPOT <= 50 ms with no request failed.
    With ``--api-server-counts``: (b) once per number of API server processes
    (``minipaged serve --api-server-count N``), each on a server of its own; (c) and the top-level
    ``saturated`` then belong to the last count, and ``by_api_server_count`` keeps each count's (b).
(d) With ``--budgets``: one server per chunked-prefill token budget (``--max-num-batched-tokens``),
    each loaded at the same rate: TTFT and TPOT against the budget.

The load runs in ``--client-processes`` processes (``serve_load.run_load_processes``): one Python
process reads about 17k chunks/s, fewer than the engine makes, and ``client_cpu_s`` shows when the
client set the pace.

Writes OUT/serve_h200.json (serve_cpu.json without a GPU). ``--base-url`` measures a server already
running instead of starting one (and is how the tests drive (b) and (c) against a fake server).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import math
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.bench_serve import course_requests  # noqa: E402
from benchmarks.serve_load import LoadRequest, run_load, run_load_processes  # noqa: E402

MODEL_SPEC = "random:qwen3-0.6b"
"""the random model with Qwen3-0.6B's shape, as the server is assumed to name it"""

ENGINE_OPTIONS = {"block_size": 16, "max_num_seqs": 256}
"""bench_fast_engine's options for ``minipaged.LLM``; the server gets them as vLLM's flags"""

SWEEP_FRACTIONS = (0.125, 0.25, 0.5, 0.75, 0.9, 1.0, 1.25)
"""sweep rates as fractions of the saturated request throughput"""

SLO_TTFT_P99_MS, SLO_TPOT_P99_MS = 1000.0, 50.0


def server_command(model_spec: str, port: int, options: dict) -> list[str]:
    """The server's command line: ``python -m minipaged serve MODEL --host 127.0.0.1 --port P``
    and each engine option as its vLLM flag (``max_num_seqs`` -> ``--max-num-seqs``). The one
    place to adapt if the server names the random model, or an option, otherwise."""
    command = [sys.executable, "-m", "minipaged", "serve", model_spec, "--host", "127.0.0.1",
               "--port", str(port)]
    for name, value in options.items():
        command += ["--" + name.replace("_", "-"), str(value)]
    return command


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_ready(base_url: str, process: subprocess.Popen, timeout: float) -> None:
    """Poll ``/v1/models`` until it answers 200; raise if the process ends or time runs out."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode} before it was ready")
        try:
            if httpx.get(base_url + "/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"the server at {base_url} was not ready after {timeout:.0f} s")


@contextlib.contextmanager
def running_server(command: list[str], base_url: str, log_path: Path, ready_timeout: float = 300,
                   cwd: str | None = None):
    """Start ``command``, wait for it to serve ``base_url``, and stop it (by its own pid) at the
    end; its output goes to ``log_path``."""
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=cwd)
        try:
            wait_until_ready(base_url, process, ready_timeout)
            yield process
        finally:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def inprocess_row(num_requests: int, max_tokens: int) -> dict:
    """(a): bench_fast_engine's ``fast_engine`` (``minipaged.LLM``) in a child process,
    so that its GPU memory is free again before the server starts."""
    from benchmarks.bench_fast_engine import run_engine_in_child

    args = argparse.Namespace(num_requests=num_requests, max_tokens=max_tokens, quick=False,
                              max_num_seqs=ENGINE_OPTIONS["max_num_seqs"], workload="course")
    return run_engine_in_child("fast_engine", args)


def sweep_rates(saturated_rate: float, fractions=SWEEP_FRACTIONS) -> list[float]:
    """Request rates for the sweep: ``fractions`` of the saturated request throughput, rounded to
    three significant digits, ascending and distinct."""
    if not saturated_rate > 0 or math.isinf(saturated_rate):
        raise ValueError(f"need a positive, finite saturated rate, got {saturated_rate}")
    rates = {float(f"{f * saturated_rate:.3g}") for f in fractions}
    return sorted(r for r in rates if r > 0)


def highest_rate_meeting(runs: list[dict], ttft_p99_ms: float = SLO_TTFT_P99_MS,
                         tpot_p99_ms: float = SLO_TPOT_P99_MS) -> float | None:
    """The highest finite ``request_rate`` among ``runs`` with no failed request, p99 TTFT <=
    ``ttft_p99_ms`` and p99 TPOT <= ``tpot_p99_ms`` (None if no run meets them)."""
    best = None
    for run in runs:
        rate, ttft, tpot = run["request_rate"], run["ttft_ms"]["p99"], run["tpot_ms"]["p99"]
        if rate == "inf" or run["failed"] or not run["completed"] or ttft is None:
            continue
        if ttft <= ttft_p99_ms and (tpot is None or tpot <= tpot_p99_ms):
            best = rate if best is None else max(best, rate)
    return best


def served(base_url: str, model: str, requests: list[LoadRequest], rates: list[float] | None,
           sweep_requests: int, run_timeout: float, ignore_eos: bool = True,
           processes: int = 1, log=print) -> dict:
    """(b) and (c) against the server at ``base_url``, with ``processes`` client processes."""
    common = {"model": model, "timeout": run_timeout, "seed": 0, "ignore_eos": ignore_eos,
              "slo_ttft_ms": SLO_TTFT_P99_MS, "slo_tpot_ms": SLO_TPOT_P99_MS}
    warm = [LoadRequest(r.prompt[:32], min(32, r.prompt_len), 4) for r in requests[:4]]
    asyncio.run(run_load(base_url, warm, **common))      # compiled kernels, captured graphs
    saturated = run_load_processes(base_url, requests, math.inf, 1.0, 256, processes=processes,
                                   **common)
    log(f"served, all at once: {saturated['output_throughput']:,.0f} out tok/s, "
        f"{saturated['request_throughput']:.2f} req/s, ITL p50 {saturated['itl_ms']['median']} ms, "
        f"client CPU {saturated['client_cpu_s']:.1f} s over {saturated['duration_s']:.1f} s")
    if rates is None:
        rates = sweep_rates(saturated["request_throughput"]) if saturated["completed"] else []
    sweep = []
    for rate in rates:
        run = run_load_processes(base_url, requests[:sweep_requests], rate, 1.0, 256,
                                 processes=processes, **common)
        log(f"  rate {rate:g}/s: {run['output_throughput']:,.0f} out tok/s, TTFT p99 "
            f"{run['ttft_ms']['p99']} ms, TPOT p99 {run['tpot_ms']['p99']} ms, "
            f"failed {run['failed']}")
        sweep.append(run)
    return {"saturated": saturated, "sweep": sweep,
            "highest_rate_within_slo": highest_rate_meeting(sweep),
            "slo": {"ttft_p99_ms": SLO_TTFT_P99_MS, "tpot_p99_ms": SLO_TPOT_P99_MS}}


def budget_sweep(model_spec: str, budgets: list[int], requests: list[LoadRequest], rate: float,
                 run_timeout: float, ignore_eos: bool, processes: int, out: Path,
                 ready_timeout: float, log=print) -> list[dict]:
    """(d) One server per chunked-prefill token budget (``--max-num-batched-tokens``), each loaded
    with the same requests at the same ``rate``: how the budget trades TTFT against TPOT."""
    common = {"timeout": run_timeout, "seed": 0, "ignore_eos": ignore_eos,
              "slo_ttft_ms": SLO_TTFT_P99_MS, "slo_tpot_ms": SLO_TPOT_P99_MS}
    runs = []
    for budget in budgets:
        port = free_port()
        base_url = f"http://127.0.0.1:{port}"
        options = ENGINE_OPTIONS | {"max_num_batched_tokens": budget}
        with running_server(server_command(model_spec, port, options), base_url,
                            out / f"serve_server_budget{budget}.log", ready_timeout):
            model = first_model(base_url)
            warm = [LoadRequest(r.prompt[:32], min(32, r.prompt_len), 4) for r in requests[:4]]
            asyncio.run(run_load(base_url, warm, model=model, **common))
            run = run_load_processes(base_url, requests, rate, 1.0, 256, processes=processes,
                                     model=model, **common)
        run["max_num_batched_tokens"] = budget
        log(f"  budget {budget}: TTFT p50/p99 {run['ttft_ms']['median']}/{run['ttft_ms']['p99']} "
            f"ms, TPOT p50/p99 {run['tpot_ms']['median']}/{run['tpot_ms']['p99']} ms")
        runs.append(run)
    return runs


def first_model(base_url: str) -> str:
    import httpx

    return httpx.get(base_url + "/v1/models", timeout=30).json()["data"][0]["id"]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results")
    parser.add_argument("--model-spec", default=MODEL_SPEC)
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--vocab-size", type=int, default=151936, help="bench_engine's model's")
    parser.add_argument("--rates", help="comma-separated requests/s; default: fractions of (b)")
    parser.add_argument("--sweep-requests", type=int, help="requests per sweep rate (default all)")
    parser.add_argument("--base-url", help="a running server: measure it, start none")
    parser.add_argument("--skip-inprocess", action="store_true")
    parser.add_argument("--ready-timeout", type=float, default=600)
    parser.add_argument("--run-timeout", type=float, default=300, help="seconds per load run")
    parser.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                        help="send ignore_eos: true (off for a server that refuses the field)")
    parser.add_argument("--client-processes", type=int, default=1,
                        help="load-generator processes (one Python process reads ~17k chunks/s)")
    parser.add_argument("--budgets", help="comma-separated --max-num-batched-tokens values for "
                        "(d), each on its own server (default: no budget sweep)")
    parser.add_argument("--budget-rate", type=float,
                        help="requests/s of (d) (default: 0.75 of (b)'s request throughput)")
    parser.add_argument("--skip-served", action="store_true", help="only (a) and (d)")
    parser.add_argument("--result-name", help="file name under --out (default serve_<device>.json)")
    parser.add_argument("--api-server-counts", default="1",
                        help="comma-separated --api-server-count values to compare in (b)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    on_gpu = torch.cuda.is_available()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"device": torch.cuda.get_device_name() if on_gpu else f"cpu ({platform.node()})",
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "command": "python benchmarks/serve_vs_inprocess.py " + " ".join(
                  sys.argv[1:] if argv is None else argv),
              "workload": {"name": "course", "requests": args.num_requests,
                           "prompt_len": [100, 1024], "max_tokens": args.max_tokens,
                           "ignore_eos": args.ignore_eos, "greedy": True, "model": args.model_spec},
              "engine_options": ENGINE_OPTIONS, "max_concurrency": 256}
    path = out / (args.result_name or f"serve_{'h200' if on_gpu else 'cpu'}.json")

    def save() -> None:  # after every phase: a run cut short keeps what it measured
        path.write_text(json.dumps(record, indent=1) + "\n")

    if not args.skip_inprocess:
        row = inprocess_row(args.num_requests, args.max_tokens)
        record["inprocess"] = row
        print(f"in-process: {row.get('tok_per_s', 0):,.0f} out tok/s, TPOT p50 "
              f"{row.get('p50_tpot_s')} s", flush=True)
        save()
    requests = course_requests(args.num_requests, 0, args.vocab_size, output_len=args.max_tokens)
    rates = None if args.rates is None else [float(r) for r in args.rates.split(",")]
    sweep_requests = args.sweep_requests or args.num_requests

    def measure(base_url: str, sweep: bool = True) -> dict:
        return served(base_url, first_model(base_url), requests, rates if sweep else [],
                      sweep_requests, args.run_timeout, args.ignore_eos, args.client_processes)

    record["client_processes"] = args.client_processes
    if args.skip_served:
        record |= {"saturated": None, "sweep": [], "highest_rate_within_slo": None}
    elif args.base_url:
        record["server"] = {"base_url": args.base_url, "started_here": False}
        record |= measure(args.base_url.rstrip("/"))
    else:
        counts = [int(c) for c in args.api_server_counts.split(",")]
        record["by_api_server_count"] = []
        for i, count in enumerate(counts):
            port = free_port()
            base_url = f"http://127.0.0.1:{port}"
            options = ENGINE_OPTIONS | ({"api_server_count": count} if count != 1 else {})
            command = server_command(args.model_spec, port, options)
            print(f"server with {count} API server process(es)", flush=True)
            with running_server(command, base_url, out / f"serve_server_{count}.log",
                                args.ready_timeout):
                result = measure(base_url, sweep=i == len(counts) - 1)
            record["by_api_server_count"].append({"api_server_count": count,
                                                  "saturated": result["saturated"]})
            save()
        # since chapter 16's engine core: the CLI steps the engine in a process of its own
        record["server"] = {"command": " ".join(command[1:]), "started_here": True,
                            "engine_core": "process", "api_server_count": counts[-1]}
        record |= result
    save()
    if args.budgets:
        if not (args.budget_rate or record["saturated"]):
            raise SystemExit("--budgets with --skip-served needs --budget-rate")
        rate = args.budget_rate or 0.75 * record["saturated"]["request_throughput"]
        record["budget_rate"] = rate
        record["budget_sweep"] = []
        for budget in (int(b) for b in args.budgets.split(",")):
            record["budget_sweep"] += budget_sweep(
                args.model_spec, [budget], requests[:sweep_requests], rate, args.run_timeout,
                args.ignore_eos, args.client_processes, out, args.ready_timeout)
            save()
    inprocess = record.get("inprocess", {})
    saturated = record["saturated"] or {"completed": 0, "failed": 0}
    if inprocess.get("tok_per_s") and saturated["completed"]:
        record["served_over_inprocess_throughput"] = (record["saturated"]["output_throughput"]
                                                      / inprocess["tok_per_s"])
    save()
    print(f"highest rate within p99 TTFT <= 1 s, p99 TPOT <= 50 ms: "
          f"{record['highest_rate_within_slo']} req/s; wrote {path}")
    ok = saturated["failed"] == 0 and "error" not in inprocess
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
