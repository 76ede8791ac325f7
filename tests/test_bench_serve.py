"""benchmarks/bench_serve.py and serve_load.py against a fake OpenAI server with planted delays.

The fake server (FastAPI under uvicorn, on 127.0.0.1, a free port, in a thread) streams
``max_tokens`` tokens: the first chunk after ``FIRST`` seconds, then one chunk every ``GAP`` seconds,
``per_chunk`` tokens a chunk, then a bare finish chunk (no text, a ``finish_reason``) and a usage
chunk; ``/v1/chat/completions`` streams the same as ``delta.content``. It keeps every request's arrival time and the
peak number of requests in flight, and answers 400 to a prompt that starts with token id 0.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("httpx")
fastapi = pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks import bench_serve  # noqa: E402
from benchmarks.serve_load import (LoadRequest, RequestResult, arrival_times,  # noqa: E402
                                   percentile, run_load, summarize)

FIRST, GAP = 0.05, 0.01


class FakeServer:
    """The fake server's app and what it saw."""

    def __init__(self, per_chunk: int = 1):
        from fastapi.responses import JSONResponse, StreamingResponse

        self.per_chunk = per_chunk
        self.in_flight = self.peak = 0
        self.arrivals: list[float] = []
        self.bodies: list[dict] = []
        app = fastapi.FastAPI()

        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}

        @app.post("/v1/completions")
        async def completions(body: dict):
            self.arrivals.append(time.perf_counter())
            self.bodies.append(body)
            if body["prompt"][0] == 0:
                return JSONResponse({"error": {"message": "bad prompt"}}, status_code=400)
            return StreamingResponse(self.stream(body), media_type="text/event-stream")

        @app.post("/v1/chat/completions")
        async def chat(body: dict):
            self.arrivals.append(time.perf_counter())
            self.bodies.append(body)
            return StreamingResponse(self.stream(body, chat=True), media_type="text/event-stream")

        self.app = app

    async def stream(self, body, chat=False):
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            tokens = body["max_tokens"]
            await asyncio.sleep(FIRST)
            sent = 0
            while sent < tokens:
                if sent:
                    await asyncio.sleep(GAP)
                n = min(self.per_chunk, tokens - sent)
                sent += n
                choice = {"index": 0, "text": "ab" * n, "finish_reason": None}
                if chat:
                    choice = {"index": 0, "delta": {"content": "ab" * n}, "finish_reason": None}
                yield f"data: {json.dumps({'choices': [choice]})}\n\n"
            end = {"index": 0, "delta": {}} if chat else {"index": 0, "text": ""}
            yield f"data: {json.dumps({'choices': [end | {'finish_reason': 'length'}]})}\n\n"
            prompt_tokens = 9 if chat else len(body["prompt"])
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": tokens,
                     "total_tokens": prompt_tokens + tokens}
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            self.in_flight -= 1


@pytest.fixture
def serve():
    """``serve(per_chunk)`` -> (base_url, FakeServer), stopped at the test's end."""
    running = []

    def start(per_chunk: int = 1):
        fake = FakeServer(per_chunk)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(fake.app, log_level="warning", lifespan="off"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.started
        running.append((server, thread, sock))
        return f"http://127.0.0.1:{sock.getsockname()[1]}", fake

    yield start
    for server, thread, sock in running:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def requests(count, output_len=8, prompt_len=4, first_id=7):
    return [LoadRequest([first_id] + [1] * (prompt_len - 1), prompt_len, output_len)
            for _ in range(count)]


def load(base_url, reqs, **kwargs):
    kwargs.setdefault("model", "fake-model")
    return asyncio.run(run_load(base_url, reqs, timeout=20, keep_requests=True, **kwargs))


def test_latencies_match_the_planted_delays(serve):
    base_url, fake = serve()
    load(base_url, requests(1, output_len=2))             # a first connection, imports done
    run = load(base_url, requests(8, output_len=6), max_concurrency=2)
    assert (run["completed"], run["failed"]) == (8, 0)
    # TTFT: the first chunk after 50 ms, counted from each request's own send (four waves of
    # two, 100 ms apart: counted from the run's start, the median would be near 200 ms);
    # TPOT and ITL: a chunk of one token every 10 ms
    assert 1e3 * FIRST <= run["ttft_ms"]["median"] < 1e3 * FIRST + 60
    assert 1e3 * GAP * 0.8 <= run["itl_ms"]["median"] < 1e3 * GAP + 15
    assert 1e3 * GAP * 0.8 <= run["tpot_ms"]["median"] < 1e3 * GAP + 15
    for r in run["requests"]:
        assert len(r["itl"]) == 5                     # 6 chunks, 5 gaps
        assert r["e2e"] >= FIRST + 5 * GAP * 0.8
    assert run["total_output_tokens"] == 48 and run["total_input_tokens"] == 32
    body = fake.bodies[-1]
    assert body["stream"] and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True and body["max_tokens"] == 6 and body["model"] == "fake-model"


def test_output_tokens_come_from_usage_not_chunks(serve):
    """Three tokens a chunk: 12 tokens come in 4 chunks; usage says 12, TPOT spreads the
    3 gaps over 11 tokens while ITL stays one gap per chunk."""
    base_url, _ = serve(per_chunk=3)
    run = load(base_url, requests(3, output_len=12), ignore_eos=False)
    assert run["usage_reported"] and run["total_output_tokens"] == 36
    for r in run["requests"]:
        assert r["output_tokens"] == 12 and len(r["itl"]) == 3
        assert r["tpot"] == pytest.approx((r["e2e"] - r["ttft"]) / 11)
    assert run["tpot_ms"]["median"] < 0.6 * run["itl_ms"]["median"]


def test_max_concurrency_is_respected(serve):
    base_url, fake = serve()
    run = load(base_url, requests(12, output_len=4), max_concurrency=3)
    assert run["completed"] == 12
    assert fake.peak == 3                     # reached, never passed
    base_url, fake = serve()
    load(base_url, requests(12, output_len=4))
    assert fake.peak > 3                      # all at once without the cap


def test_poisson_arrivals_spread_start_times(serve):
    base_url, fake = serve()
    rate, count = 40.0, 40
    run = load(base_url, requests(count, output_len=2), rate=rate)
    sent = sorted(r["sent"] for r in run["requests"])
    span = sent[-1] - sent[0]
    # 39 exponential gaps of mean 25 ms: about 1 s in all (sd about 0.16 s); sends may only
    # lag their arrival times on a busy machine, so the bound above is loose
    assert 0.5 < span < 3.0
    gaps = [b - a for a, b in zip(sent, sent[1:])]
    assert max(gaps) > 2 * percentile(gaps, 50)   # exponential gaps, not a metronome
    arrived = sorted(fake.arrivals)
    assert arrived[-1] - arrived[0] > 0.5                 # the server saw them spread out too


def test_arrival_times_follow_the_rate_and_burstiness():
    for burstiness in (1.0, 0.25, 4.0):
        times = arrival_times(4001, 10.0, burstiness, seed=1)
        gaps = [b - a for a, b in zip(times, times[1:])]
        mean = sum(gaps) / len(gaps)
        cv = math.sqrt(sum((g - mean) ** 2 for g in gaps) / len(gaps)) / mean
        assert mean == pytest.approx(0.1, rel=0.1)
        assert cv == pytest.approx(1 / math.sqrt(burstiness), rel=0.1)   # gamma: cv = 1/sqrt(k)
    assert arrival_times(5, math.inf) == [0.0] * 5
    assert arrival_times(6, 3.0, seed=2) == arrival_times(6, 3.0, seed=2)


def test_failed_requests_are_counted_and_kept_out_of_latencies(serve):
    base_url, _ = serve()
    reqs = requests(4, output_len=5) + requests(3, output_len=50, first_id=0)
    run = load(base_url, reqs, slo_ttft_ms=10_000, slo_tpot_ms=10_000)
    assert (run["completed"], run["failed"]) == (4, 3)
    assert run["errors"] == {"HTTP 400": 3}
    assert run["total_output_tokens"] == 20
    assert run["e2e_ms"]["p99"] < 1e3 * (FIRST + 50 * GAP)   # no 50-token request among them
    assert run["goodput"] == pytest.approx(4 / run["duration_s"])


def test_goodput_counts_requests_within_both_slos():
    def done(ttft, e2e, out):
        return RequestResult(ok=True, output_tokens=out, ttft=ttft, e2e=e2e, usage_reported=True)

    results = [done(0.1, 1.1, 11),      # TPOT 100 ms
               done(0.1, 0.2, 11),      # TPOT 10 ms
               done(2.0, 2.1, 11),      # TTFT 2 s
               done(0.1, 0.1, 1),       # one token: no TPOT to miss
               RequestResult(error="HTTP 500: x")]
    metrics = summarize(results, 2.0, slo_ttft_ms=500, slo_tpot_ms=50)
    assert metrics["goodput"] == 1.0    # 2 of 4 completed requests, over 2 s
    assert (metrics["completed"], metrics["failed"]) == (4, 1)
    assert metrics["tpot_ms"]["median"] == pytest.approx(10.0)
    assert summarize(results, 2.0)["goodput"] is None
    assert percentile([1, 2, 3, 4], 50) == 2.5 and percentile([5], 99) == 5


def test_the_run_timeout_fails_what_is_left(serve):
    base_url, _ = serve()
    reqs = requests(2, output_len=2) + requests(2, output_len=400)
    start = time.monotonic()
    run = asyncio.run(run_load(base_url, reqs, model="fake-model", timeout=1.0))
    assert time.monotonic() - start < 3
    assert (run["completed"], run["failed"]) == (2, 2) and run["errors"] == {"timeout": 2}


def test_command_line_sweeps_rates_and_writes_the_documented_json(serve, tmp_path, capsys):
    base_url, fake = serve()
    out = tmp_path / "serve.json"
    code = bench_serve.main(["--base-url", base_url, "--dataset", "sharegpt-stats",
                             "--num-prompts", "6", "--input-len", "5", "--output-len", "3",
                             "--rates", "50,inf", "--max-concurrency", "4", "--slo-ttft-ms",
                             "1000", "--slo-tpot-ms", "100", "--timeout", "30", "--vocab-size",
                             "1000", "--device-label", "fake", "--result-json", str(out),
                             "--no-progress"])
    assert code == 0
    record = json.loads(out.read_text())
    assert record["model"] == "fake-model"                       # the first of /v1/models
    assert record["device"] == "fake" and record["client_host"] and record["date"]
    assert record["command"].startswith("python benchmarks/bench_serve.py --base-url")
    assert [run["request_rate"] for run in record["runs"]] == [50.0, "inf"]
    for run in record["runs"]:
        assert 0 < run["client_cpu_s"]
        for key in ("completed", "failed", "duration_s", "request_throughput",
                    "output_throughput", "total_token_throughput", "goodput"):
            assert key in run
        for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
            assert set(run[key]) == {"mean", "median", "p99"}
        assert run["completed"] == 6 and run["total_output_tokens"] == 18
        assert run["goodput"] == pytest.approx(6 / run["duration_s"])
    assert len(fake.bodies) == 12 and all(len(b["prompt"]) == 5 for b in fake.bodies)
    assert all(max(b["prompt"]) < 1000 for b in fake.bodies)
    assert "TTFT p50" in capsys.readouterr().out


def test_datasets_have_their_documented_lengths():
    course = bench_serve.course_requests(64, vocab=1000)
    assert all(100 <= r.prompt_len <= 1024 and r.output_len == 512 for r in course)
    assert len({r.prompt_len for r in course}) > 30
    from benchmarks.bench_engine import workload
    assert [r.prompt for r in course] == workload(64, 100, 1024, 1000)
    share = bench_serve.sharegpt_stats_requests(2000, vocab=1000)
    mean_in = sum(r.prompt_len for r in share) / len(share)
    mean_out = sum(r.output_len for r in share) / len(share)
    assert mean_in == pytest.approx(161.31, rel=0.1) and mean_out == pytest.approx(337.99, rel=0.1)
    assert all(r.prompt_len + r.output_len <= 2048 and len(r.prompt) == r.prompt_len
               for r in share)


# -- benchmarks/serve_vs_inprocess.py: its pieces, and (b) and (c) against the fake server -------

def test_server_command_passes_engine_options_as_vllm_flags():
    from benchmarks.serve_vs_inprocess import server_command

    command = server_command("random:qwen3-0.6b", 8123, {"max_num_seqs": 256, "block_size": 16})
    assert command[0] == sys.executable
    assert command[1:] == ["-m", "minipaged", "serve", "random:qwen3-0.6b", "--host", "127.0.0.1",
                           "--port", "8123", "--max-num-seqs", "256", "--block-size", "16"]


def test_sweep_rates_climb_past_saturation():
    from benchmarks.serve_vs_inprocess import sweep_rates

    rates = sweep_rates(37.3)
    assert len(rates) >= 6 and rates == sorted(set(rates))
    assert rates[0] < 0.2 * 37.3 and rates[-1] > 37.3
    with pytest.raises(ValueError):
        sweep_rates(math.inf)


def test_highest_rate_meeting_needs_both_p99s_and_no_failure():
    from benchmarks.serve_vs_inprocess import highest_rate_meeting

    def run(rate, ttft, tpot, failed=0):
        return {"request_rate": rate, "completed": 10, "failed": failed,
                "ttft_ms": {"p99": ttft}, "tpot_ms": {"p99": tpot}}

    runs = [run(1, 100, 20), run(2, 900, 45), run(4, 1100, 30), run(8, 200, 60),
            run(16, 100, 10, failed=1), run("inf", 10, 10)]
    assert highest_rate_meeting(runs) == 2
    assert highest_rate_meeting(runs, ttft_p99_ms=2000) == 4
    assert highest_rate_meeting(runs[2:4]) is None


def test_running_server_waits_for_models_and_stops_the_process(tmp_path):
    from benchmarks.serve_vs_inprocess import free_port, running_server

    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "models").write_text('{"data": [{"id": "m"}]}')
    port = free_port()
    command = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    with running_server(command, f"http://127.0.0.1:{port}", tmp_path / "log", 30,
                        cwd=str(tmp_path)) as process:
        import httpx
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"][0]["id"] == "m"
    assert process.poll() is not None
    with pytest.raises(RuntimeError, match="exited with 3"):
        with running_server([sys.executable, "-c", "raise SystemExit(3)"],
                            f"http://127.0.0.1:{free_port()}", tmp_path / "log2", 30):
            pass


def test_serve_vs_inprocess_measures_a_running_server(serve, tmp_path):
    from benchmarks import serve_vs_inprocess

    base_url, fake = serve()
    code = serve_vs_inprocess.main(["--base-url", base_url, "--skip-inprocess", "--out",
                                    str(tmp_path), "--num-requests", "6", "--max-tokens", "3",
                                    "--run-timeout", "20"])
    assert code == 0
    (path,) = tmp_path.glob("serve_*.json")
    record = json.loads(path.read_text())
    assert record["device"] and record["date"] and record["command"].startswith("python ")
    saturated, sweep = record["saturated"], record["sweep"]
    assert saturated["completed"] == 6 and saturated["total_output_tokens"] == 18
    assert saturated["itl_ms"]["median"] is not None
    assert len(sweep) >= 6 and sweep[-1]["request_rate"] > saturated["request_throughput"]
    # the fake server's 50 ms TTFT and 10 ms TPOT are within the limits, at least at low rates
    best = record["highest_rate_within_slo"]
    (at_best,) = [run for run in sweep if run["request_rate"] == best]
    assert at_best["ttft_ms"]["p99"] <= 1000 and at_best["tpot_ms"]["p99"] <= 50
    assert best >= sweep[0]["request_rate"]
    assert len(fake.bodies) == 4 + 6 + 6 * len(sweep)     # warm-up, saturated run, sweep
    assert all(100 <= len(b["prompt"]) <= 1024 for b in fake.bodies[4:])


def test_chat_endpoint_streams_deltas_and_ends_on_a_bare_finish_chunk(serve):
    """Chat: the prompt goes as a user message, tokens come as ``delta.content``; the bare
    finish chunk that closes both streams is no token (no ITL gap of its own)."""
    base_url, fake = serve()
    run = load(base_url, requests(2, output_len=5), endpoint="/v1/chat/completions")
    assert run["completed"] == 2 and run["total_output_tokens"] == 10
    assert run["total_input_tokens"] == 18                  # the server's usage, not our count
    assert all(len(r["itl"]) == 4 for r in run["requests"])
    assert fake.bodies[0]["messages"][0]["role"] == "user" and "prompt" not in fake.bodies[0]
    assert 1e3 * FIRST <= run["ttft_ms"]["median"]


def test_several_client_processes_merge_into_one_run(serve):
    from benchmarks.serve_load import run_load_processes
    base_url, fake = serve()
    load(base_url, requests(1, output_len=2))
    run = run_load_processes(base_url, requests(9, output_len=5), max_concurrency=3, processes=3,
                             model="fake-model", timeout=60, keep_requests=True)
    assert (run["completed"], run["failed"], run["client_processes"]) == (9, 0, 3)
    assert run["total_output_tokens"] == 45 and len(run["requests"]) == 9
    assert 1e3 * FIRST <= run["ttft_ms"]["median"] < 1e3 * FIRST + 200
    # all three started together: the run lasts about one request, not three in a row
    assert run["duration_s"] < FIRST + 5 * GAP + 1.0
