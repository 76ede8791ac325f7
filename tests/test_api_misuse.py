"""Misuse of the public API: each case ends in correct behaviour or a typed error that says
what to do, and the engine stays healthy (no leaked block, it serves the next request)."""

import dataclasses

import numpy as np
import pytest
import torch

import minipaged
from minipaged.engine.llm_engine import EngineError, InvalidRequestError, LLMEngine
from minipaged.model.qwen3 import random_qwen3, tiny_qwen3_config
from minipaged.engine.scheduler import PromptTooLongError, SamplingParams

PROMPTS = [[5, 17, 33, 9, 2, 71], [100, 200, 300], [7, 8, 9, 10, 11, 12, 13]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
ENGINES = pytest.mark.parametrize("engine", [LLMEngine, minipaged.LLM],
                                  ids=["chapter 12", "minipaged.LLM"])


@pytest.fixture(scope="module")
def hf():
    return random_qwen3(tiny_qwen3_config(), seed=0, dtype=torch.float32)


@pytest.fixture(scope="module")
def reference(hf):
    llm = LLMEngine(hf, block_size=4, num_blocks=64)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def tokens(outputs):
    return [o.outputs[0].token_ids for o in outputs]


def assert_healthy(llm, reference):
    """Idle, every block free, and it still serves a batch correctly."""
    assert not llm.has_unfinished_requests()
    assert llm.manager.num_free_blocks == llm.manager.num_physical_blocks
    assert tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False)) == reference
    assert llm.manager.num_free_blocks == llm.manager.num_physical_blocks


# 1. generate() must not swallow requests queued with add_request
@ENGINES
def test_generate_refuses_while_added_requests_are_unfinished(hf, reference, engine):
    llm = engine(hf, block_size=4, num_blocks=64)
    earlier = llm.add_request(PROMPTS[0], GREEDY)
    with pytest.raises(EngineError, match=r"step\(\).*abort"):
        llm.generate(PROMPTS[1:], GREEDY, use_tqdm=False)
    assert llm.has_unfinished_requests()  # state unchanged: the earlier request is there
    done = []
    while llm.has_unfinished_requests():
        done += llm.step()
    assert [o.request_id for o in done] == [earlier]
    assert done[0].outputs[0].token_ids == reference[0]
    assert_healthy(llm, reference)


# 2. a seeded request draws the same tokens whatever its neighbours need
def test_seeded_request_ignores_a_top_k_neighbour(hf, reference):
    llm = minipaged.LLM(hf, block_size=4, num_blocks=64)
    seeded = SamplingParams(temperature=1.0, seed=7, max_tokens=8, ignore_eos=True)
    alone = tokens(llm.generate([PROMPTS[0]], seeded, use_tqdm=False))[0]
    for neighbour in (SamplingParams(temperature=1.0, top_k=5, max_tokens=8, ignore_eos=True),
                      SamplingParams(temperature=0.8, top_p=0.5, max_tokens=8,
                                     ignore_eos=True)):
        beside = llm.generate([PROMPTS[0], PROMPTS[1]], [seeded, neighbour], use_tqdm=False)
        assert beside[0].outputs[0].token_ids == alone
        assert len(beside[1].outputs[0].token_ids) == 8
    assert_healthy(llm, reference)


def test_fused_sampler_routes_each_row():
    from minipaged.engine.fused_sampler import FusedSampler
    from minipaged.engine.scheduler import Sequence

    torch.manual_seed(0)
    logits = torch.randn(3, 512) * 3
    sampler = FusedSampler(torch.device("cpu"))
    params = [SamplingParams(temperature=1.0, seed=3), SamplingParams(temperature=0.0),
              SamplingParams(temperature=1.0, top_k=1)]
    seqs = [Sequence(i, i, [1], p) for i, p in enumerate(params)]
    for seq in seqs:
        sampler.add(seq)
    mixed = sampler(logits, seqs).tolist()
    alone = sampler(logits[:1], seqs[:1]).tolist()
    assert mixed[0] == alone[0]
    assert mixed[1:] == logits[1:].argmax(-1).tolist()  # greedy, and top_k=1


# 3. a tiny positive temperature is greedy, not an overflow
@ENGINES
@pytest.mark.parametrize("temperature", [1e-8, 1e-38])
def test_tiny_temperature_is_greedy(hf, reference, engine, temperature):
    llm = engine(hf, block_size=4, num_blocks=64)
    for extra in ({}, dict(top_k=5), dict(seed=3)):
        params = dataclasses.replace(GREEDY, temperature=temperature, **extra)
        assert tokens(llm.generate(PROMPTS, params, use_tqdm=False)) == reference
    assert_healthy(llm, reference)


def test_tiny_temperature_in_sample():
    from minipaged.engine.sampler import sample

    logits = torch.randn(4, 512) * 5
    params = [SamplingParams(temperature=t) for t in (1e-6, 1e-8, 1e-38, 1e-45)]
    assert all(p.greedy for p in params)
    assert sample(logits, params).tolist() == logits.argmax(-1).tolist()


# 4. every EOS id of the config stops a sequence
@ENGINES
def test_every_eos_id_stops(reference, engine):
    drawn = reference[0][2]
    never = next(t for t in range(512) if all(t not in r for r in reference))
    hf = random_qwen3(tiny_qwen3_config(eos_token_id=[never, drawn]), seed=0,
                      dtype=torch.float32)
    llm = engine(hf, block_size=4, num_blocks=64)
    params = SamplingParams(temperature=0.0, max_tokens=6)
    out = llm.generate([PROMPTS[0]], params, use_tqdm=False)[0].outputs[0]
    assert out.token_ids == reference[0][:reference[0].index(drawn) + 1]
    assert out.finish_reason == "stop"
    assert params.stop_token_ids == ()  # the caller's SamplingParams is left alone
    ignoring = llm.generate([PROMPTS[0]], GREEDY, use_tqdm=False)[0].outputs[0]
    assert ignoring.token_ids == reference[0] and ignoring.finish_reason == "length"
    assert_healthy(llm, reference)


# 5. max_model_len must be a positive int no larger than the model's positions
@ENGINES
@pytest.mark.parametrize("bad", [0, -1, 513, 2.5, True])
def test_max_model_len_out_of_range(hf, engine, bad):
    with pytest.raises(ValueError, match=r"max_model_len.*\[1, 512\]"):
        engine(hf, block_size=4, num_blocks=64, max_model_len=bad)


@ENGINES
def test_max_model_len_none_and_in_range(hf, engine):
    llm = engine(hf, block_size=4, num_blocks=64)
    assert llm.scheduler.config.max_model_len == 512
    llm = engine(hf, block_size=4, num_blocks=64, max_model_len=64)
    assert llm.scheduler.config.max_model_len == 64


# 6. a request whose prompt + max_tokens never fits the cache is refused
@ENGINES
def test_request_larger_than_the_cache_is_refused(hf, reference, engine):
    llm = engine(hf, block_size=4, num_blocks=8)  # 32 slots
    too_big = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    with pytest.raises(PromptTooLongError, match=r"needs 9 KV blocks.*has 8"):
        llm.add_request(PROMPTS[0], too_big)  # 6 + 30 tokens: 9 blocks of 4
    assert not llm.has_unfinished_requests()
    assert llm.manager.num_free_blocks == 8
    fits = SamplingParams(temperature=0.0, max_tokens=26, ignore_eos=True)
    outputs = llm.generate([PROMPTS[0], PROMPTS[1], PROMPTS[0]], [too_big, GREEDY, fits],
                           use_tqdm=False)
    assert "KV blocks" in outputs[0].error and outputs[0].outputs == []
    assert outputs[1].outputs[0].token_ids == reference[1]
    assert len(outputs[2].outputs[0].token_ids) == 26
    assert_healthy(llm, reference)


# 7. tensors and arrays of token ids are prompts
@ENGINES
def test_tensor_and_array_prompts(hf, reference, engine):
    llm = engine(hf, block_size=4, num_blocks=64)
    for one in (torch.tensor(PROMPTS[0]), np.array(PROMPTS[0])):
        out = llm.generate(one, GREEDY, use_tqdm=False)
        assert len(out) == 1 and out[0].outputs[0].token_ids == reference[0]
        assert out[0].prompt_token_ids == PROMPTS[0]
    batch = [PROMPTS[0][:3], PROMPTS[1]]
    expected = tokens(llm.generate(batch, GREEDY, use_tqdm=False))
    for two_d in (torch.tensor(batch), np.array(batch)):
        assert tokens(llm.generate(two_d, GREEDY, use_tqdm=False)) == expected
    assert tokens(llm.generate([torch.tensor(p) for p in PROMPTS], GREEDY,
                               use_tqdm=False)) == reference
    assert tokens(llm.generate([np.int64(t) for t in PROMPTS[0]], GREEDY,
                               use_tqdm=False)) == reference[:1]
    request = llm.add_request(torch.tensor(PROMPTS[1]), GREEDY)
    done = []
    while llm.has_unfinished_requests():
        done += llm.step()
    assert done[0].request_id == request and done[0].outputs[0].token_ids == reference[1]
    with pytest.raises(InvalidRequestError, match="integers"):
        llm.generate(torch.tensor([1.5, 2.0]), GREEDY, use_tqdm=False)
    assert_healthy(llm, reference)


# 8. bad values name the field, the value and what is allowed
@ENGINES
@pytest.mark.parametrize("bad", [0, 0.0, -0.5, 1.5, float("nan"), "0.9"])
def test_gpu_memory_utilization_out_of_range(hf, engine, bad):
    with pytest.raises(ValueError, match=r"gpu_memory_utilization.*\(0, 1\]"):
        engine(hf, block_size=4, num_blocks=64, gpu_memory_utilization=bad)


@pytest.mark.parametrize("field, bad, allowed", [
    ("seed", "7", "integer"), ("seed", 1.5, "integer"), ("seed", True, "integer"),
    ("stop_token_ids", ["a"], "integers"), ("stop_token_ids", [1.5], "integers"),
    ("stop_token_ids", 5, "integers"), ("stop_token_ids", [True], "integers"),
    ("max_tokens", 0, "positive integer"), ("max_tokens", 2.0, "positive integer"),
    ("max_tokens", True, "positive integer"),
    ("n", 0, "positive integer"), ("n", 1.0, "positive integer"),
    ("top_p", 0.0, r"\(0, 1\]"), ("top_p", 1.5, r"\(0, 1\]"), ("top_p", float("nan"), r"\(0, 1\]"),
    ("top_p", "0.5", r"\(0, 1\]"), ("temperature", "1", ">= 0"), ("top_k", 2.0, "integer"),
])
def test_sampling_params_name_the_bad_field(field, bad, allowed):
    with pytest.raises(ValueError, match=rf"{field}.*{allowed}") as error:
        SamplingParams(**{field: bad})
    assert repr(bad) in str(error.value) or str(bad) in str(error.value)


def test_sampling_params_accept_integer_likes():
    params = SamplingParams(seed=np.int64(3), stop_token_ids=np.array([4, 5]))
    assert params.seed == 3 and type(params.seed) is int and params.stop_token_ids == (4, 5)


@ENGINES
def test_engine_rejects_bad_request_and_stays_healthy(hf, reference, engine):
    llm = engine(hf, block_size=4, num_blocks=64)
    with pytest.raises(InvalidRequestError, match="vocabulary"):
        llm.add_request(PROMPTS[0], SamplingParams(stop_token_ids=[10_000]))
    assert_healthy(llm, reference)


# 9. device="cuda" without a GPU says so up front
@ENGINES
@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda")])
def test_cuda_without_a_gpu(hf, engine, device, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises((EngineError, ValueError),
                       match=r"device='cuda.*no CUDA GPU is available.*device='cpu' or None"):
        engine(hf, block_size=4, num_blocks=64, device=device)
