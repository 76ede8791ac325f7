"""Load against an OpenAI-compatible server: arrivals, streamed requests, and their metrics.

The library half of ``benchmarks/bench_serve.py`` (which is its command line); a GPU benchmark
calls ``run_load`` in-process. Any server that speaks the OpenAI protocol will do (minipaged's, or
vLLM's), which is what makes a comparison fair: the same client measures both.

One request: a POST to ``/v1/completions`` (or ``/v1/chat/completions``) with ``stream: true`` and
``stream_options: {"include_usage": true}``, read as server-sent events. The times kept, from the
moment the request is sent:

- TTFT, time to first token: the first chunk that carries a token.
- ITL, inter-token latency: the gaps between consecutive chunks that carry tokens (a server may put
  more than one token in a chunk, so ITL is per chunk, not per token).
- E2E, end-to-end latency: until the stream ends.
- TPOT, time per output token: ``(e2e - ttft) / (output_tokens - 1)``, with ``output_tokens`` from the
  final chunk's ``usage`` (counted from the chunks only where a server sends no usage).

A chunk "carries a token" when it has a choice, unless that choice is a bare end marker (empty text
and a ``finish_reason``). A request fails when the server answers with an error status, the stream
breaks, no token arrives, or the run's time limit ends it; failures are counted and kept out of every
latency.

Arrivals: gaps drawn from a gamma distribution with shape ``burstiness`` and mean ``1 / rate``
(``burstiness`` 1 is a Poisson process; below 1 burstier, above 1 more regular); ``rate`` infinite
sends everything at once. ``max_concurrency`` caps the requests in flight: an arrival waits for a
free slot, and its latencies count from when it is sent.

One process parses every event (json, on one core): at tens of thousands of tokens/s that core can
become the limit, so a run records the process's CPU seconds, ``client_cpu_s``; when they approach
``duration_s``, the client, not the server, set the pace.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class LoadRequest:
    """One request to send: a prompt (token ids, or text for chat) and the tokens to generate."""

    prompt: list[int] | str
    prompt_len: int
    output_len: int


@dataclass
class RequestResult:
    """What one request measured; times in seconds, ``sent`` relative to the run's start."""

    ok: bool = False
    sent: float = 0.0
    prompt_tokens: int = 0
    output_tokens: int = 0
    usage_reported: bool = False
    ttft: float | None = None
    e2e: float | None = None
    itl: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def tpot(self) -> float | None:
        if not self.ok or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


# -- arrivals -----------------------------------------------------------------------------------

def arrival_times(count: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Seconds after the start at which each of ``count`` requests arrives: the first at 0, then
    gamma-distributed gaps of mean ``1 / rate`` and shape ``burstiness`` (1 = Poisson)."""
    if rate <= 0 or burstiness <= 0:
        raise ValueError(f"rate and burstiness must be positive, got {rate}, {burstiness}")
    if math.isinf(rate):
        return [0.0] * count
    rng = random.Random(seed)
    times, now = [], 0.0
    for i in range(count):
        if i:
            now += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
        times.append(now)
    return times


# -- one streamed request -----------------------------------------------------------------------

def request_body(endpoint: str, model: str, request: LoadRequest, ignore_eos: bool,
                 extra_body: dict | None) -> dict:
    """The JSON body: the prompt, ``max_tokens``, greedy, streamed with usage; ``ignore_eos``
    (a vLLM extension) only when asked for, and ``extra_body``'s fields on top."""
    body = {"model": model, "max_tokens": request.output_len, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}}
    if endpoint.endswith("chat/completions"):
        prompt = request.prompt if isinstance(request.prompt, str) else " ".join(
            str(t) for t in request.prompt)
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = request.prompt
    if ignore_eos:
        body["ignore_eos"] = True
    body.update(extra_body or {})
    return body


def carries_token(choice: dict) -> bool:
    """A chunk's choice stands for a token unless it is a bare end marker."""
    text = choice.get("text")
    if text is None:
        text = (choice.get("delta") or {}).get("content")
    return bool(text) or choice.get("finish_reason") is None


async def send_request(client, url: str, body: dict, headers: dict, result: RequestResult,
                       t0: float) -> RequestResult:
    """POST ``body`` and read its event stream into ``result`` (``t0``: the run's start)."""
    start = time.perf_counter()
    result.sent = start - t0
    last = None
    chunks = 0
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                result.error = f"HTTP {response.status_code}: {text[:200]}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter()
                event = json.loads(data)
                if "error" in event:
                    result.error = f"error event: {str(event['error'])[:200]}"
                    return result
                choices = event.get("choices") or []
                if choices and carries_token(choices[0]):
                    if last is None:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last = now
                    chunks += 1
                usage = event.get("usage")
                if usage and usage.get("completion_tokens") is not None:
                    result.output_tokens = int(usage["completion_tokens"])
                    result.prompt_tokens = int(usage.get("prompt_tokens") or result.prompt_tokens)
                    result.usage_reported = True
        result.e2e = time.perf_counter() - start
    except Exception as error:  # a broken connection, a bad event: this request failed
        result.error = f"{type(error).__name__}: {error}"
        return result
    if chunks == 0:
        result.error = "no token in the stream"
        return result
    if not result.usage_reported:
        result.output_tokens = chunks
    result.ok = True
    return result


# -- metrics ------------------------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100), interpolated linearly between the closest ranks."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def spread_ms(values: list[float]) -> dict:
    """Mean, median and p99 of seconds, in milliseconds (None where there is nothing)."""
    if not values:
        return {"mean": None, "median": None, "p99": None}
    return {"mean": 1e3 * sum(values) / len(values), "median": 1e3 * percentile(values, 50),
            "p99": 1e3 * percentile(values, 99)}


def meets_slo(result: RequestResult, slo_ttft_ms: float | None, slo_tpot_ms: float | None) -> bool:
    """A completed request within both limits (a one-token request has no TPOT to miss)."""
    if not result.ok:
        return False
    if slo_ttft_ms is not None and 1e3 * result.ttft > slo_ttft_ms:
        return False
    tpot = result.tpot
    return slo_tpot_ms is None or tpot is None or 1e3 * tpot <= slo_tpot_ms


def summarize(results: list[RequestResult], duration: float, slo_ttft_ms: float | None = None,
              slo_tpot_ms: float | None = None) -> dict:
    """The run's metrics from its requests: counts, throughputs over ``duration`` seconds,
    latency spreads (completed requests only) and goodput (requests/s within both SLOs, or None
    when no SLO is set)."""
    done = [r for r in results if r.ok]
    output_tokens = sum(r.output_tokens for r in done)
    prompt_tokens = sum(r.prompt_tokens for r in done)
    errors: dict[str, int] = {}
    for r in results:
        if not r.ok:
            kind = (r.error or "unknown").split(":")[0]
            errors[kind] = errors.get(kind, 0) + 1
    goodput = None
    if slo_ttft_ms is not None or slo_tpot_ms is not None:
        goodput = sum(meets_slo(r, slo_ttft_ms, slo_tpot_ms) for r in done) / duration
    return {
        "completed": len(done), "failed": len(results) - len(done), "errors": errors,
        "duration_s": duration,
        "total_input_tokens": prompt_tokens, "total_output_tokens": output_tokens,
        "usage_reported": all(r.usage_reported for r in done) if done else None,
        "request_throughput": len(done) / duration,
        "output_throughput": output_tokens / duration,
        "total_token_throughput": (prompt_tokens + output_tokens) / duration,
        "goodput": goodput, "slo_ttft_ms": slo_ttft_ms, "slo_tpot_ms": slo_tpot_ms,
        "ttft_ms": spread_ms([r.ttft for r in done]),
        "tpot_ms": spread_ms([r.tpot for r in done if r.tpot is not None]),
        "itl_ms": spread_ms([gap for r in done for gap in r.itl]),
        "e2e_ms": spread_ms([r.e2e for r in done]),
    }


# -- a run --------------------------------------------------------------------------------------

async def run_load(base_url: str, requests: list[LoadRequest], rate: float = math.inf,
                   burstiness: float = 1.0, max_concurrency: int | None = None, *,
                   model: str, endpoint: str = "/v1/completions", api_key: str | None = None,
                   ignore_eos: bool = True, extra_body: dict | None = None, seed: int = 0,
                   slo_ttft_ms: float | None = None, slo_tpot_ms: float | None = None,
                   timeout: float | None = None, progress: bool = False,
                   keep_requests: bool = False, start_at: float | None = None) -> dict:
    """Send ``requests`` to ``base_url + endpoint`` at ``rate`` per second (see the module's text)
    and return ``summarize``'s metrics plus the run's settings; with ``keep_requests``, also every
    request's own result under ``"requests"``. ``timeout`` bounds the run: requests still waiting
    or streaming then fail with ``"timeout"``. ``start_at`` (``time.time()`` seconds) delays the
    run's start, so that several client processes start together."""
    import httpx

    url = base_url.rstrip("/") + endpoint
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    arrivals = arrival_times(len(requests), rate, burstiness, seed)
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    results = [RequestResult(prompt_tokens=r.prompt_len) for r in requests]
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(requests), file=sys.stderr, desc=f"rate {rate:g}/s")
    limits = httpx.Limits(max_connections=max_concurrency or len(requests) or 1,
                          max_keepalive_connections=max_concurrency or len(requests) or 1)

    async with httpx.AsyncClient(timeout=httpx.Timeout(None), limits=limits) as client:
        if start_at is not None:
            await asyncio.sleep(max(0.0, start_at - time.time()))
        t0, cpu0 = time.perf_counter(), time.process_time()

        async def one(i: int) -> None:
            await asyncio.sleep(max(0.0, t0 + arrivals[i] - time.perf_counter()))
            body = request_body(endpoint, model, requests[i], ignore_eos, extra_body)
            if slots is None:
                await send_request(client, url, body, headers, results[i], t0)
            else:
                async with slots:
                    await send_request(client, url, body, headers, results[i], t0)
            if bar is not None:
                bar.update(1)

        tasks = [asyncio.create_task(one(i)) for i in range(len(requests))]
        _, pending = await asyncio.wait(tasks, timeout=timeout) if tasks else (set(), set())
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        duration = time.perf_counter() - t0
        client_cpu = time.process_time() - cpu0
    if bar is not None:
        bar.close()
    for result in results:
        if not result.ok and result.error is None:
            result.error = "timeout: the run's time limit ended the request"
    metrics = summarize(results, duration, slo_ttft_ms, slo_tpot_ms)
    run = {"request_rate": rate if math.isfinite(rate) else "inf", "burstiness": burstiness,
           "max_concurrency": max_concurrency, "num_prompts": len(requests),
           # this process's CPU seconds over the run: near duration_s, the client is the limit
           "client_cpu_s": client_cpu} | metrics
    if keep_requests:
        run["requests"] = [asdict(r) | {"tpot": r.tpot} for r in results]
    return run


# -- several client processes -------------------------------------------------------------------

def _load_in_child(base_url: str, requests: list[LoadRequest], rate: float, burstiness: float,
                   max_concurrency: int | None, kwargs: dict) -> dict:
    return asyncio.run(run_load(base_url, requests, rate, burstiness, max_concurrency,
                                keep_requests=True, **kwargs))


def run_load_processes(base_url: str, requests: list[LoadRequest], rate: float = math.inf,
                       burstiness: float = 1.0, max_concurrency: int | None = None, *,
                       processes: int = 1, seed: int = 0, slo_ttft_ms: float | None = None,
                       slo_tpot_ms: float | None = None, keep_requests: bool = False,
                       **kwargs) -> dict:
    """``run_load`` spread over ``processes`` client processes, for servers faster than one
    Python process can read (see ``client_cpu_s``). Process ``i`` sends every ``processes``-th
    request from ``i`` at ``rate / processes`` (Poisson streams add up to a Poisson stream of the
    whole rate; other burstiness only approximately) with its share of ``max_concurrency``; all
    start together and the runs merge into one summary: throughputs over the longest run,
    ``client_cpu_s`` summed over processes."""
    import concurrent.futures
    import multiprocessing

    if processes <= 1:
        return asyncio.run(run_load(base_url, requests, rate, burstiness, max_concurrency,
                                    seed=seed, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms,
                                    keep_requests=keep_requests, **kwargs))
    start_at = time.time() + 5.0  # time for the children to start and import
    share = None if max_concurrency is None else max(1, math.ceil(max_concurrency / processes))
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(processes, mp_context=context) as pool:
        futures = [pool.submit(_load_in_child, base_url, requests[i::processes], rate / processes,
                               burstiness, share, kwargs | {"seed": seed + i, "start_at": start_at})
                   for i in range(processes)]
        runs = [f.result() for f in futures]
    results = [RequestResult(**{k: v for k, v in r.items() if k != "tpot"})
               for run in runs for r in run["requests"]]
    duration = max(run["duration_s"] for run in runs)
    merged = {"request_rate": rate if math.isfinite(rate) else "inf", "burstiness": burstiness,
              "max_concurrency": max_concurrency, "num_prompts": len(requests),
              "client_processes": processes,
              "client_cpu_s": sum(run["client_cpu_s"] for run in runs)}
    merged |= summarize(results, duration, slo_ttft_ms, slo_tpot_ms)
    if keep_requests:
        merged["requests"] = [asdict(r) | {"tpot": r.tpot} for r in results]
    return merged
