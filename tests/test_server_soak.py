"""A bounded disconnect soak of the server (chapter 17): 200 short streamed requests, a random third
of them cut off mid-stream by their client. The dashboard's snapshot stays consistent under the
load; afterwards every block is back, the manager is consistent and the server still serves."""

import asyncio
import random
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from minipaged.engine.llm_engine import LLMEngine  # noqa: E402
from minipaged.entrypoints.openai_server import create_app  # noqa: E402
from tests.serving import LiveServer, check_pool_state, smollm2_tokenizer, tiny_model  # noqa: E402

REQUESTS, CONCURRENCY, DEADLINE_S = 200, 24, 400


def test_disconnects_under_load_leak_nothing():
    tokenizer = smollm2_tokenizer()
    engine = LLMEngine(tiny_model(tokenizer), tokenizer=tokenizer, block_size=4, num_blocks=96,
                       max_num_seqs=16, max_model_len=64, check_invariants=True)
    rng = random.Random(0)
    cut = set(rng.sample(range(REQUESTS), REQUESTS // 3))
    with LiveServer(create_app(engine, model_name="tiny", max_waiting=None)) as server:
        async def one(client, i, gate, outcome):
            body = {"model": "tiny", "prompt": [rng.randrange(1, 49152) for _ in range(rng.randrange(3, 12))],
                    "max_tokens": 3, "temperature": 0, "stream": True, "ignore_eos": True}
            async with gate:
                async with client.stream("POST", "/v1/completions", json=body) as response:
                    assert response.status_code == 200
                    async for line in response.aiter_lines():
                        if line.startswith("data: {") and i in cut:
                            outcome["cut"] += 1
                            return  # leaving the block closes the connection mid-stream
                        if line == "data: [DONE]":
                            outcome["done"] += 1

        async def snapshots(client, stop, seen):
            while not stop.is_set():
                check_pool_state((await client.get("/dashboard/state")).json())
                seen.append(1)
                await asyncio.sleep(0.05)  # the load may take under a second

        async def main():
            gate, outcome, stop, seen = asyncio.Semaphore(CONCURRENCY), {"cut": 0, "done": 0}, asyncio.Event(), []
            async with httpx.AsyncClient(base_url=server.url, timeout=DEADLINE_S) as client:
                watcher = asyncio.create_task(snapshots(client, stop, seen))
                await asyncio.wait_for(asyncio.gather(*(one(client, i, gate, outcome)
                                                        for i in range(REQUESTS))), DEADLINE_S)
                stop.set()
                await watcher
            return outcome, len(seen)

        outcome, snapshots_taken = asyncio.run(main())
        assert outcome == {"cut": len(cut), "done": REQUESTS - len(cut)}
        assert snapshots_taken > 3
        deadline = time.monotonic() + 60
        while True:  # the last aborts are applied at the next step boundary
            state = server.state()
            if state["num_free_blocks"] == state["num_blocks"] or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        check_pool_state(state)
        assert state["num_free_blocks"] == state["num_blocks"] and not state["holders"]
        assert not state["running"] and not state["waiting"]
        answer = httpx.post(server.url + "/v1/completions", timeout=60,
                            json={"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 2}).json()
        assert answer["usage"]["completion_tokens"] == 2
