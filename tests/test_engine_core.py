"""The engine core in its own process (chapter 16): a request aborted by its client frees its
blocks in the core, the core's death ends every open request with a clear error and later ones
with 503 (nothing hangs), a stopped server leaves no child process, and a stream that fell
behind gets everything that arrived meanwhile in one update."""

import asyncio
import json
import os
import time

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from minipaged.engine.llm_engine import LLMEngine  # noqa: E402
from minipaged.entrypoints.core_client import CoreStream, EngineCoreClient  # noqa: E402
from minipaged.entrypoints.engine_bridge import RequestProgress, SampleDelta  # noqa: E402
from minipaged.entrypoints.openai_server import create_app  # noqa: E402
from tests.serving import LiveServer, check_pool_state, tiny_model  # noqa: E402

os.environ.setdefault("OMP_NUM_THREADS", "1")
VOCAB = 512
LONG = {"model": "tiny", "prompt": [1, 2, 3, 4, 5], "max_tokens": 400, "temperature": 0,
        "ignore_eos": True}


class _Words:  # tiny_model only needs a length
    def __len__(self):
        return VOCAB


def new_engine():
    return LLMEngine(tiny_model(_Words()), block_size=4, num_blocks=256, max_num_seqs=4,
                     max_model_len=512, check_invariants=True)


def in_core(core):
    """Read in the core process, between two steps (pickled by name: module level)."""
    manager = core.engine.manager
    return (len(core.bridge.requests), manager.num_free_blocks, manager.num_physical_blocks,
            manager.first_inconsistency(), os.getpid())


def test_the_server_owns_a_core_process_and_an_abort_frees_its_blocks():
    app = create_app(new_engine(), model_name="tiny")
    with LiveServer(app) as server:
        owner = app.state.engine_loop
        assert isinstance(owner, EngineCoreClient) and owner.process.is_alive()

        async def cut_after_one_chunk():
            async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
                async with client.stream("POST", "/v1/completions",
                                         json={**LONG, "stream": True}) as response:
                    async for line in response.aiter_lines():
                        if line.startswith("data: {"):
                            return  # leaving closes the connection mid-stream
        asyncio.run(cut_after_one_chunk())
        deadline = time.monotonic() + 60
        while True:  # the abort is applied at the core's next step boundary
            state = server.state()
            if state["num_free_blocks"] == state["num_blocks"] or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        check_pool_state(state)
        assert state["num_free_blocks"] == state["num_blocks"] and not state["holders"]

        tracked, free, total, problem, pid = asyncio.run(owner.call(in_core))
        assert (tracked, free, problem) == (0, total, None)
        assert pid == owner.process.pid != os.getpid()  # it ran in the core process
    assert not owner.process.is_alive() and owner.process.exitcode == 0


def test_a_dead_core_ends_open_requests_with_an_error_and_later_ones_get_503():
    app = create_app(new_engine(), model_name="tiny")
    with LiveServer(app) as server:
        core = app.state.engine_loop.process

        async def main():
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
                whole = asyncio.create_task(client.post("/v1/completions", json=LONG))
                lines = []
                async with client.stream("POST", "/v1/completions",
                                         json={**LONG, "stream": True}) as response:
                    async for line in response.aiter_lines():
                        if line:
                            lines.append(line)
                        if len(lines) == 2:
                            core.kill()  # the kernel's OOM killer, a segfault, kill -9
                return lines, await whole

        lines, whole = asyncio.run(asyncio.wait_for(main(), 90))
        assert lines[-1] == "data: [DONE]"
        error = json.loads(lines[-2][len("data: "):])["error"]
        assert "engine core process died" in error["message"] and error["type"] == "server_error"
        assert whole.status_code == 500, whole.text
        assert "engine core process died" in whole.json()["error"]["message"]
        later = httpx.post(server.url + "/v1/completions", json=LONG, timeout=30)
        assert later.status_code == 503 and later.json()["error"]["type"] == "server_error"
        health = httpx.get(server.url + "/health", timeout=30)
        assert health.status_code == 503 and "died" in health.json()["error"]["message"]
        assert httpx.get(server.url + "/dashboard/state", timeout=30).status_code == 503


def test_a_core_that_cannot_build_its_engine_says_why():
    from minipaged.entrypoints.core_client import EngineCoreError

    def broken():
        raise RuntimeError("no such model")

    client = EngineCoreClient(build=broken)
    client.start_method = "fork"  # a local function: fork, so that nothing is pickled
    with pytest.raises(EngineCoreError, match="no such model"):
        client.start()
    client.process.join(10)
    assert not client.process.is_alive()


def test_a_stream_that_fell_behind_gets_one_merged_update():
    async def main():
        stream = CoreStream(None, "r", asyncio.get_running_loop())
        steps = [RequestProgress("r", [SampleDelta(0, "a", [1], None, [{1: -0.1}]),
                                       SampleDelta(1, "x", [7], None, [{7: -0.2}])], False),
                 RequestProgress("r", [SampleDelta(1, "y", [8], "stop", [{8: -0.3}])], False),
                 RequestProgress("r", [SampleDelta(0, "b", [2], "length", [{2: -0.4}])], True,
                                 num_output_tokens=4)]
        for step in steps:
            stream.push(step)
        merged = await stream.__anext__()
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()
        return merged

    merged = asyncio.run(main())
    assert merged.finished and merged.num_output_tokens == 4
    (a, b) = sorted(merged.deltas, key=lambda d: d.index)
    assert (a.text, a.token_ids, a.finish_reason) == ("ab", [1, 2], "length")
    assert (b.text, b.token_ids, b.finish_reason) == ("xy", [7, 8], "stop")
    assert a.logprobs == [{1: -0.1}, {2: -0.4}]


def test_a_sample_of_n_that_stops_early_reports_its_finish_at_once():
    from minipaged.engine.scheduler import SamplingParams
    from minipaged.entrypoints.engine_bridge import EngineBridge
    from minipaged.entrypoints.llm import LLM
    llm = LLM(tiny_model(_Words()), block_size=4, num_blocks=256, max_num_seqs=8)
    bridge = EngineBridge(llm.llm_engine, None)
    params = SamplingParams(n=4, temperature=1.0, seed=3, max_tokens=40,
                            stop_token_ids=list(range(0, 120)))
    bridge.add("r", [1, 2, 3, 4, 5], params)
    ended, last_token, step, tokens = {}, {}, 0, {i: [] for i in range(4)}
    while bridge.has_unfinished():
        step += 1
        for update in bridge.step():
            for d in update.deltas:
                assert d.index not in ended, "a sample got tokens or a finish after its end"
                if d.token_ids:
                    last_token[d.index] = step
                    tokens[d.index] += d.token_ids
                if d.finish_reason:
                    ended[d.index] = (step, d.finish_reason)
    assert sorted(ended) == [0, 1, 2, 3]
    for i, (when, reason) in ended.items():
        assert when == last_token[i], (i, when, last_token[i])  # with its last token
        assert reason == ("stop" if len(tokens[i]) < 40 else "length")
    assert len({when for when, _ in ended.values()}) > 1, "no sample ended before another"


def test_two_front_ends_share_one_core_and_each_hears_only_of_its_own_requests():
    from minipaged.engine.scheduler import SamplingParams
    from functools import partial

    from minipaged.entrypoints.metrics import ServerMetrics, render_metrics

    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = [[1 + i, 2, 3, 4 + i] for i in range(6)]
    # spawned, as minipaged serve starts it (and immune to a fork of torch's thread pool)
    first = EngineCoreClient(build=new_engine, metrics=partial(ServerMetrics, "tiny"))
    first.start(front_ends=2)
    second = EngineCoreClient(channel=first.spare_channels[0]).start()
    heard = {id(first): set(), id(second): set()}
    for front in (first, second):
        front.observers.append(lambda stats, progress, key=id(front):
                               heard[key].update(u.request_id for u in progress))

    async def run(front, i):
        stream = await front.submit(prompts[i], params, request_id=f"r{i}")
        tokens = []
        async for update in stream:
            tokens += [t for d in update.deltas for t in d.token_ids]
        return tokens

    async def main():
        fronts = [first if i % 2 == 0 else second for i in range(len(prompts))]
        got = await asyncio.gather(*(run(f, i) for i, f in enumerate(fronts)))
        return got, await second.call(render_metrics), await first.call(in_core)

    try:
        got, metrics, (tracked, free, total, problem, _) = asyncio.run(
            asyncio.wait_for(main(), 120))
        expected = [o.outputs[0].token_ids for o in new_engine().generate(prompts, params)]
        assert got == expected
        assert heard[id(first)] == {"r0", "r2", "r4"} and heard[id(second)] == {"r1", "r3", "r5"}
        assert 'minipaged:request_success_total{finished_reason="length",model_name="tiny"} 6.0' \
            in metrics.decode()  # kept in the core: both front ends' requests, counted once
        assert (tracked, free, problem) == (0, total, None)
        second.stop()  # any front end stops the server as a whole
        first.process.join(30)
        assert first.process.exitcode == 0
        deadline = time.monotonic() + 30
        while first.alive and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not first.alive and "died" not in (first.last_error or "")
    finally:
        first.stop(timeout=10)
