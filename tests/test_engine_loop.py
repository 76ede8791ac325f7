"""The engine loop (chapter 16) without HTTP, on minipaged.LLM: tokens still on the GPU
(overlapped steps) are streamed once they arrive, a cancelled request frees its blocks, and a
shut-down loop ends every stream and refuses new work."""

import asyncio

import pytest
import torch

from minipaged.entrypoints.engine_loop import EngineLoop, EngineLoopClosedError
from minipaged.entrypoints.llm import LLM
from minipaged.model.qwen3 import random_qwen3, tiny_qwen3_config
from minipaged.engine.scheduler import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
PROMPTS = [[1, 2, 3, 4, 5], [9, 8, 7], [20, 21, 22, 23, 24, 25, 26]]


@pytest.fixture(scope="module")
def model():
    return random_qwen3(tiny_qwen3_config(), seed=0, dtype=torch.float32)


async def tokens_of(engine_loop, prompt, cancel_after=None):
    ids, updates = [], 0
    async with await engine_loop.submit(prompt, GREEDY) as stream:
        async for update in stream:
            for d in update.deltas:
                assert min(d.token_ids, default=0) >= 0, d  # no token still on the GPU
                ids += d.token_ids
            updates += 1
            if updates == cancel_after:
                break
    return ids


def test_overlapped_tokens_all_arrive_and_a_cancel_frees_blocks(model):
    offline = LLM(model, block_size=4, num_blocks=64).generate(PROMPTS, GREEDY, use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 5 for o in offline)
    llm = LLM(model, block_size=4, num_blocks=64, check_invariants=True)
    engine_loop = EngineLoop(llm).start()

    async def main():
        got = await asyncio.gather(tokens_of(engine_loop, PROMPTS[0]),
                                   tokens_of(engine_loop, PROMPTS[1], cancel_after=1),
                                   tokens_of(engine_loop, PROMPTS[2]))
        manager = llm.manager
        pool = await engine_loop.call(lambda loop: (manager.num_free_blocks,
                                                    manager.first_inconsistency(),
                                                    loop.bridge.requests.copy()))
        return got, pool

    try:
        (first, cancelled, third), (free, problem, left) = asyncio.run(main())
    finally:
        engine_loop.stop()
    assert (first, third) == (offline[0].outputs[0].token_ids, offline[2].outputs[0].token_ids)
    assert cancelled == offline[1].outputs[0].token_ids[:len(cancelled)]
    assert 1 <= len(cancelled) < 5
    assert free == llm.manager.num_physical_blocks and problem is None and not left


def test_a_stopped_loop_ends_streams_and_refuses_new_requests(model):
    llm = LLM(model, block_size=4, num_blocks=64)
    engine_loop = EngineLoop(llm).start()
    long = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)

    async def main():
        stream = await engine_loop.submit(PROMPTS[0], long)
        await stream.__anext__()
        await asyncio.get_running_loop().run_in_executor(None, engine_loop.stop)
        with pytest.raises(EngineLoopClosedError):
            async for _ in stream:
                pass
        with pytest.raises(EngineLoopClosedError):
            await engine_loop.submit(PROMPTS[1], GREEDY)

    asyncio.run(main())
    assert llm.manager.num_free_blocks == llm.manager.num_physical_blocks
    assert not llm.has_unfinished_requests()
