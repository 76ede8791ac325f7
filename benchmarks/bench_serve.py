"""Load an OpenAI-compatible server and measure it, in the manner of ``vllm bench serve``.

    python benchmarks/bench_serve.py --base-url http://127.0.0.1:8000 [--model NAME]
        [--dataset course|sharegpt-stats] [--num-prompts N] [--input-len L] [--output-len T]
        [--request-rate R | --rates 1,2,4,inf] [--burstiness B] [--max-concurrency C]
        [--endpoint /v1/completions|/v1/chat/completions] [--api-key K] [--no-ignore-eos]
        [--slo-ttft-ms MS] [--slo-tpot-ms MS] [--timeout S] [--seed S]
        [--device-label "H200 (server)"] [--result-json results/serve_xxx.json]

Any server that speaks the protocol works: ``minipaged serve`` or ``vllm serve``. Prompts are lists of
token ids (no tokenizer needed on either side; chat sends the ids as text, so its prompt lengths are
approximate), drawn uniformly from ``--vocab-size`` ids, and ``ignore_eos`` is sent (a vLLM
extension; ``--no-ignore-eos`` leaves it out) so that every request generates its ``max_tokens``.

Datasets:

- ``course``: the course's workload, ``bench_engine.workload``: prompts uniform in 100-1024 tokens
  (seeded), 512 new tokens each, 256 requests unless ``--num-prompts`` says otherwise.
- ``sharegpt-stats``: lengths with the ShareGPT statistics the vLLM paper reports (Kwon et al. 2023,
  Fig. 11: 161.31 input and 337.99 output tokens on average), drawn as chapter 2 draws them
  (``minipaged.book.fragmentation.generate_workload("sharegpt")``: log-normal lengths with a chosen spread
  of 1.0 and the location fitted to those means, prompt plus output at most 2,048 tokens).

``--input-len``/``--output-len`` replace the dataset's lengths with one fixed length.

Per rate (``--rates`` sweeps several in one run, the same requests each time): TTFT, TPOT, ITL and
E2E (mean, median, p99, in ms), request, output-token and total-token throughput, goodput
(requests/s within both SLOs), completed and failed counts, and the duration; see
``benchmarks/serve_load.py`` for how each is measured. A table goes to stdout and, with
``--result-json``, a JSON with the client's host, ``--device-label``, the date and this command line.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import platform
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.serve_load import LoadRequest, run_load  # noqa: E402

QWEN3_VOCAB = 151936
"""Qwen3's vocabulary: the course workload's prompts are drawn from it (bench_engine's model)"""

SHAREGPT_SOURCE = ("Kwon et al. 2023 (vLLM), Fig. 11: ShareGPT means 161.31 input, 337.99 output "
                   "tokens; log-normal spread 1.0 (chosen, chapter 2); prompt + output <= 2048")


def course_requests(num_prompts: int = 256, seed: int = 0, vocab: int = QWEN3_VOCAB,
                    lo: int = 100, hi: int = 1024, output_len: int = 512) -> list[LoadRequest]:
    """The course workload, with bench_engine's own prompts (the same token ids for the same
    arguments, so the in-process engine and a server see one workload)."""
    from benchmarks.bench_engine import workload

    return [LoadRequest(p, len(p), output_len) for p in workload(num_prompts, lo, hi, vocab, seed)]


def sharegpt_stats_requests(num_prompts: int, seed: int = 0,
                            vocab: int = QWEN3_VOCAB) -> list[LoadRequest]:
    """Token-id prompts with lengths of the ShareGPT statistics (``SHAREGPT_SOURCE``)."""
    from minipaged.book.fragmentation import generate_workload

    rng = random.Random(seed)
    trace = generate_workload("sharegpt", num_prompts, seed, rate=None, max_len=2048)
    return [LoadRequest([rng.randrange(vocab) for _ in range(t.prompt_len)], t.prompt_len,
                        t.output_len) for t in trace]


def build_requests(dataset: str, num_prompts: int | None, seed: int, vocab: int,
                   input_len: int | None = None, output_len: int | None = None) -> list[LoadRequest]:
    """The dataset's requests, with ``input_len``/``output_len`` fixed where given."""
    if dataset == "course":
        requests = course_requests(num_prompts or 256, seed, vocab)
    elif dataset == "sharegpt-stats":
        requests = sharegpt_stats_requests(num_prompts or 1000, seed, vocab)
    else:
        raise ValueError(f"unknown dataset {dataset!r} (course, sharegpt-stats)")
    rng = random.Random(seed + 1)
    fixed = []
    for r in requests:
        prompt = r.prompt
        if input_len is not None:
            prompt = [rng.randrange(vocab) for _ in range(input_len)]
        fixed.append(LoadRequest(prompt, len(prompt), output_len or r.output_len))
    return fixed


def parse_rates(text: str) -> list[float]:
    """``"1,2,4,inf"`` -> ``[1.0, 2.0, 4.0, inf]``; every rate positive."""
    rates = [float(part) for part in text.split(",") if part.strip()]
    if not rates or any(not r > 0 for r in rates):
        raise argparse.ArgumentTypeError(f"rates must be positive numbers or inf, got {text!r}")
    return rates


async def first_model(base_url: str, api_key: str | None) -> str:
    """The first model ``/v1/models`` lists."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.get(base_url.rstrip("/") + "/v1/models", headers=headers)
        response.raise_for_status()
        return response.json()["data"][0]["id"]


def table(runs: list[dict]) -> str:
    """A short table: one line per rate."""
    def ms(run, key, stat):
        value = run[key][stat]
        return "-" if value is None else f"{value:.1f}"

    lines = [f"{'rate/s':>7} {'done':>5} {'fail':>4} {'req/s':>6} {'out tok/s':>10} "
             f"{'TTFT p50':>9} {'p99':>8} {'TPOT p50':>9} {'p99':>7} {'ITL p50':>8} "
             f"{'E2E p50':>9} {'goodput':>8}"]
    for run in runs:
        goodput = "-" if run["goodput"] is None else f"{run['goodput']:.2f}"
        lines.append(
            f"{str(run['request_rate']):>7} {run['completed']:>5} {run['failed']:>4} "
            f"{run['request_throughput']:>6.2f} {run['output_throughput']:>10.1f} "
            f"{ms(run, 'ttft_ms', 'median'):>9} {ms(run, 'ttft_ms', 'p99'):>8} "
            f"{ms(run, 'tpot_ms', 'median'):>9} {ms(run, 'tpot_ms', 'p99'):>7} "
            f"{ms(run, 'itl_ms', 'median'):>8} {ms(run, 'e2e_ms', 'median'):>9} {goodput:>8}")
    return "\n".join(lines) + "\n(latencies in ms)"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--endpoint", default="/v1/completions",
                        choices=["/v1/completions", "/v1/chat/completions"])
    parser.add_argument("--model", help="default: the first of /v1/models")
    parser.add_argument("--api-key")
    parser.add_argument("--dataset", default="course", choices=["course", "sharegpt-stats"])
    parser.add_argument("--num-prompts", type=int, help="default 256 (course), 1000 (sharegpt-stats)")
    parser.add_argument("--input-len", type=int)
    parser.add_argument("--output-len", type=int)
    parser.add_argument("--vocab-size", type=int, default=QWEN3_VOCAB,
                        help="prompt token ids are drawn below it")
    parser.add_argument("--request-rate", type=float, default=math.inf,
                        help="requests/s, Poisson (inf: all at once)")
    parser.add_argument("--rates", type=parse_rates, help="sweep, e.g. 1,2,4,8,inf")
    parser.add_argument("--burstiness", type=float, default=1.0,
                        help="gamma shape of the gaps: 1 Poisson, <1 burstier")
    parser.add_argument("--max-concurrency", type=int)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                        help="send ignore_eos: true (a vLLM extension field)")
    parser.add_argument("--extra-body", type=json.loads, default=None,
                        help="JSON object merged into every request body")
    parser.add_argument("--slo-ttft-ms", type=float)
    parser.add_argument("--slo-tpot-ms", type=float)
    parser.add_argument("--timeout", type=float, help="seconds for the whole invocation")
    parser.add_argument("--device-label", help="the server's device, for the record")
    parser.add_argument("--result-json")
    parser.add_argument("--no-progress", action="store_true")
    return parser.parse_args(argv)


async def bench(args: argparse.Namespace) -> dict:
    """Every rate of ``args`` against the server; the record ``--result-json`` holds."""
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    model = args.model or await first_model(args.base_url, args.api_key)
    requests = build_requests(args.dataset, args.num_prompts, args.seed, args.vocab_size,
                              args.input_len, args.output_len)
    runs = []
    for rate in args.rates or [args.request_rate]:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        runs.append(await run_load(
            args.base_url, requests, rate, args.burstiness, args.max_concurrency, model=model,
            endpoint=args.endpoint, api_key=args.api_key, ignore_eos=args.ignore_eos,
            extra_body=args.extra_body, seed=args.seed, slo_ttft_ms=args.slo_ttft_ms,
            slo_tpot_ms=args.slo_tpot_ms, timeout=left, progress=not args.no_progress))
    return {
        "device": args.device_label or f"not given (client on {platform.node()})",
        "client_host": platform.node(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": getattr(args, "command", "python " + " ".join(sys.argv)),
        "base_url": args.base_url, "endpoint": args.endpoint, "model": model,
        "dataset": {"name": args.dataset, "num_prompts": len(requests),
                    "input_len": args.input_len, "output_len": args.output_len,
                    "vocab_size": args.vocab_size, "seed": args.seed,
                    "mean_prompt_len": sum(r.prompt_len for r in requests) / max(1, len(requests)),
                    "mean_output_len": sum(r.output_len for r in requests) / max(1, len(requests)),
                    "source": SHAREGPT_SOURCE if args.dataset == "sharegpt-stats"
                    else "benchmarks/bench_engine.py workload: prompts 100-1024 uniform, 512 out"},
        "ignore_eos": args.ignore_eos, "runs": runs}


def main(argv=None) -> int:
    args = parse_args(argv)
    args.command = "python benchmarks/bench_serve.py " + " ".join(
        sys.argv[1:] if argv is None else argv)
    record = asyncio.run(bench(args))
    print(table(record["runs"]))
    if args.result_json:
        path = Path(args.result_json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {path}")
    return 0 if all(run["completed"] for run in record["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
