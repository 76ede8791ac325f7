"""The two attention backends: PyTorch ops equal to the Triton kernels (run by the interpreter
here), and an engine on the PyTorch backend equal to transformers token for token in fp32."""

import random

import pytest
import torch

import minipaged.entrypoints.llm
from minipaged.kernels.decode_attention import (DECODE_ATTENTION, paged_attention,
                                                paged_attention_reference, paged_attention_torch)
from minipaged.engine.llm_engine import CacheFormat, LLMEngine, resolve_attention_backend
from minipaged.model.fast_qwen3 import FastQwen3Model
from minipaged.kernels.kv_cache import LAYOUTS, KVCacheError, PagedKVCache
from minipaged.model import qwen3
from minipaged.model.qwen3 import Qwen3PagedModel, random_qwen3, reference_greedy, tiny_qwen3_config
from minipaged.engine.scheduler import SamplingParams

NEW = 6


def pair_of_caches(layout, dtype, seed=0):
    """Two identical caches (random contents), one per backend."""
    torch.manual_seed(seed)
    caches = [PagedKVCache(2, 12, 4, 3, 16, dtype=dtype, device="cpu", layout=layout)
              for _ in range(2)]
    noise = torch.randn(caches[0].storage.shape).to(dtype)
    for cache, backend in zip(caches, ("triton", "torch")):
        cache.storage.copy_(noise)
        cache.attention_backend = backend
    return caches


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_torch_write_equals_the_kernel(layout, dtype):
    triton_cache, torch_cache = pair_of_caches(layout, dtype)
    slots = torch.randperm(triton_cache.num_slots)[:11]
    slots[::3] = -1
    key, value = torch.randn(2, 11, 3, 16).to(dtype)
    for cache in (triton_cache, torch_cache):
        cache.write(1, key, value, slots)
    assert torch.equal(triton_cache.storage, torch_cache.storage)
    kept = slots >= 0
    k, _ = torch_cache.gather(1, torch.arange(12), torch_cache.num_slots)
    assert torch.equal(k[slots[kept]], key[kept])     # and it really wrote them
    with pytest.raises(KVCacheError):                  # a bad slot is refused, nothing written
        torch_cache.write(0, key, value, torch.full((11,), torch_cache.num_slots))
    assert torch.equal(triton_cache.storage, torch_cache.storage)


def test_torch_write_skips_out_of_range_slots_without_the_check():
    triton_cache, torch_cache = pair_of_caches("NHD", torch.float32)
    slots = torch.tensor([3, triton_cache.num_slots + 5, 7])
    key, value = torch.randn(2, 3, 3, 16)
    for cache in (triton_cache, torch_cache):
        cache.write(0, key, value, slots, check_slots=False)
    assert torch.equal(triton_cache.storage, torch_cache.storage)


def test_torch_copy_blocks_equals_the_kernel():
    triton_cache, torch_cache = pair_of_caches("HND", torch.float16)
    for cache in (triton_cache, torch_cache):
        cache.copy_blocks([(0, 5), (3, 9), (11, 2)])
    assert torch.equal(triton_cache.storage, torch_cache.storage)
    assert torch.equal(torch_cache.storage[:, :, 5], torch_cache.storage[:, :, 0])


def decode_case(lengths, block_size, group, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // block_size) for n in lengths]
    cache = PagedKVCache(1, sum(need) + 2, block_size, 2, 32, dtype=dtype, device="cpu")
    cache.storage.copy_(torch.randn(cache.storage.shape, generator=gen).to(dtype))
    pool = torch.randperm(cache.num_blocks, generator=gen).tolist()
    tables = torch.full((len(lengths), max(need) + 1), pool[-1], dtype=torch.int32)
    for b, n in enumerate(need):
        tables[b, :n] = torch.tensor(pool[sum(need[:b]):sum(need[:b]) + n])
    query = torch.randn(len(lengths), 2 * group, 32, generator=gen).to(dtype)
    return query, cache, tables, torch.tensor(lengths, dtype=torch.int32)


@pytest.mark.parametrize("lengths", [[0, 1, 7, 8, 9, 40], [13], [16, 16, 16]])
@pytest.mark.parametrize("block_size,group,dtype", [(4, 1, torch.float32),
                                                    (8, 4, torch.float32),
                                                    (16, 2, torch.float16)])
def test_torch_decode_equals_the_kernel_and_the_reference(lengths, block_size, group, dtype):
    args = decode_case(lengths, block_size, group, dtype, seed=len(lengths) + block_size)
    ref = paged_attention_reference(*args[:2], 0, *args[2:])
    ours = paged_attention_torch(*args[:2], 0, *args[2:])
    kernel = paged_attention(*args[:2], 0, *args[2:])
    tol = 1e-5 if dtype == torch.float32 else 3e-3
    assert ours.dtype == dtype and ours.shape == kernel.shape
    assert ref.norm() > 0
    assert (ours.float() - ref).norm() / ref.norm() < tol
    assert (ours.float() - kernel.float()).norm() / ref.norm() < 2 * tol
    for b, n in enumerate(lengths):
        if n == 0:
            assert torch.equal(ours[b], torch.zeros_like(ours[b]))


def test_backends_are_chosen_by_name():
    assert DECODE_ATTENTION == {"triton": paged_attention, "torch": paged_attention_torch}
    assert resolve_attention_backend("auto", "cpu") == "torch"
    assert resolve_attention_backend("auto", torch.device("cuda", 0)) == "triton"
    assert resolve_attention_backend("triton", "cpu") == "triton"
    assert resolve_attention_backend("auto", "cpu", ("triton",)) == "triton"
    with pytest.raises(ValueError, match="attention_backend must be one of"):
        resolve_attention_backend("flash", "cpu")
    with pytest.raises(ValueError, match="kv_cache_dtype='auto'"):
        resolve_attention_backend("torch", "cpu", ("triton",))


def test_the_step_plan_is_made_once_per_decode_step_and_changes_nothing(monkeypatch):
    """The model builds one TorchDecodePlan per decode step (never for prefill, the Triton
    backend or a cache with its own reader), and its logits equal those without a plan."""
    hf = random_qwen3(tiny_qwen3_config(), seed=0, dtype=torch.float32)
    built, real = [], qwen3.decode_plan
    monkeypatch.setattr(qwen3, "decode_plan", lambda b, c: built.append(real(b, c)) or built[-1])
    llm = LLMEngine(hf, block_size=4, num_blocks=64, attention_backend="torch")
    llm.generate([[1, 2, 3], [4, 5, 6, 7, 8, 9, 10]], GREEDY, use_tqdm=False)
    plans = [p for p in built if p is not None]
    assert len(plans) == NEW - 1 and len(built) > len(plans)  # decode steps only
    steps = []  # the same steps again, each run with and without its plan
    monkeypatch.setattr(qwen3, "decode_plan", lambda b, c: steps.append((b, c)) or real(b, c))
    llm.generate([[11, 12], [13, 14, 15, 16, 17]], GREEDY, use_tqdm=False)
    batch, cache = next((b, c) for b, c in steps if b.is_decode)
    with_plan = llm.model(batch, cache)
    monkeypatch.setattr(qwen3, "decode_plan", lambda b, c: None)
    assert torch.equal(llm.model(batch, cache), with_plan)
    cache.attention_backend = "triton"
    assert real(batch, cache) is None


@pytest.fixture(scope="module")
def setup():
    hf = random_qwen3(tiny_qwen3_config(), seed=0, dtype=torch.float32)
    rng = random.Random(1)
    prompts = [[rng.randrange(512) for _ in range(n)] for n in (5, 17, 33, 9, 2, 21)]
    reference, _ = reference_greedy(hf, prompts, NEW)
    assert all(len(set(t)) > 2 for t in reference), "degenerate reference output"
    return hf, prompts, reference


GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True)
ENGINES = pytest.mark.parametrize("engine", [LLMEngine, minipaged.entrypoints.llm.LLM],
                                  ids=["chapter 12", "minipaged.LLM"])


def tokens(outputs):
    return [o.outputs[0].token_ids for o in outputs]


@ENGINES
def test_auto_is_torch_on_cpu_and_the_fp8_cache_keeps_triton(setup, engine):
    hf, _, _ = setup
    llm = engine(hf, block_size=4, num_blocks=32)
    assert llm.cache.attention_backend == "torch"
    if engine is minipaged.entrypoints.llm.LLM:
        assert type(llm.model) is Qwen3PagedModel  # chapter 9's model, not the fused one
        assert type(minipaged.entrypoints.llm.LLM(hf, num_blocks=32, attention_backend="triton").model) \
            is FastQwen3Model
        fp8 = engine(hf, block_size=4, num_blocks=32, kv_cache_dtype="fp8")
        assert fp8.cache.attention_backend == "triton"
        with pytest.raises(ValueError, match="no 'torch' attention backend"):
            engine(hf, num_blocks=32, kv_cache_dtype="fp8", attention_backend="torch")
    with pytest.raises(ValueError, match="attention_backend must be one of"):
        engine(hf, num_blocks=32, attention_backend="cpu")


@ENGINES
@pytest.mark.parametrize("caching", [True, False])
@pytest.mark.parametrize("chunked", [True, False])
def test_torch_backend_equals_transformers(setup, engine, caching, chunked):
    hf, prompts, reference = setup
    llm = engine(hf, block_size=4, enable_prefix_caching=caching,
                 enable_chunked_prefill=chunked, max_num_batched_tokens=16 if chunked else 64,
                 check_invariants=True, attention_backend="torch")
    assert tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == reference
    shared = [prompts[2] + [7, 8, 9], prompts[2] + [10]]   # a cached prefix on the second
    assert tokens(llm.generate(shared, GREEDY, use_tqdm=False)) == \
        reference_greedy(hf, shared, NEW)[0]
    if caching:
        assert llm.last_run_stats()["prefix_hit_rate"] > 0.5
    assert llm.manager.num_sequences == 0


@ENGINES
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_torch_backend_preempts_and_outputs_do_not_change(setup, engine, mode):
    hf, prompts, reference = setup
    llm = engine(hf, block_size=2, num_blocks=24, preemption_mode=mode, check_invariants=True,
                 attention_backend="torch")
    assert tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == reference
    assert llm.last_run_stats()["preemptions"] > 0


@ENGINES
def test_torch_backend_parallel_sampling_matches_triton(setup, engine):
    hf, prompts, reference = setup
    greedy_n = SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True, n=3)
    seeded = SamplingParams(temperature=0.8, max_tokens=NEW, ignore_eos=True, n=3, seed=7)
    runs = {}  # the Triton run on chapter 11's parts: chapter 11's sampler on both sides
    for backend, make in (("torch", engine), ("triton", LLMEngine)):
        llm = make(hf, block_size=4, num_blocks=64, check_invariants=True,
                   attention_backend=backend)
        greedy = llm.generate(prompts[:2], greedy_n, use_tqdm=False)
        assert [[c.token_ids for c in o.outputs] for o in greedy] == \
            [[r] * 3 for r in reference[:2]]               # n copies, each the reference
        runs[backend] = [[c.token_ids for c in o.outputs]
                         for o in llm.generate(prompts[:2], seeded, use_tqdm=False)]
        assert llm.manager.num_sequences == 0
    assert runs["torch"] == runs["triton"]
    assert len({tuple(t) for t in runs["torch"][0]}) > 1     # the siblings really differ
