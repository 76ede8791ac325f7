"""Unit tests of minipaged.kernels.fp8_kv_cache (CPU: Triton interpreter; GPU: compiled, sm89+)."""

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import minipaged.kernels.fp8_kv_cache as fp8
import triton
import triton.language as tl
from minipaged.memory.block_table import blocks_needed
from minipaged.kernels.decode_attention import PagedAttentionError, paged_attention_reference
from minipaged.engine.llm_engine import MODEL_DTYPE_CACHE, CacheFormat, EngineParts, LLMEngine
from minipaged.kernels.fp8_kv_cache import (FP8_DTYPE, FP8_MAX, Fp8PagedKVCache, fp8_block_bytes,
                                            new_fp8_cache, dequantize_reference,
                                            fp8_bytes_per_token, fp8_supported, quantize_reference)
from minipaged.kernels.kv_cache import KVCacheError
from minipaged.runtime import default_device

DEVICE = default_device()
pytestmark = pytest.mark.skipif(not fp8_supported(DEVICE), reason="no FP8 on this GPU")


def e4m3_values() -> torch.Tensor:
    """Every finite e4m3 value, both signs (from all 256 bit patterns)."""
    values = torch.arange(256, dtype=torch.uint8).view(FP8_DTYPE).float()
    return values[torch.isfinite(values)].unique()


def rows_with_scale_one(values: torch.Tensor, dim: int) -> torch.Tensor:
    """``values`` laid out in rows of ``dim`` whose first element is 448 (scale 1)."""
    per_row = dim - 1
    pad = (-len(values)) % per_row
    values = torch.cat([values, torch.zeros(pad)]).view(-1, per_row)
    return torch.cat([torch.full((len(values), 1), FP8_MAX), values], dim=1)


def test_round_trip_error_bound_from_the_format():
    """|x - e4m3(x / s) s| <= 2^-4 |x| in the normal range, <= 2^-10 s below it."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(512, 3, 64, generator=gen) * torch.logspace(-3, 3, 64)
    x[:, :, 5] *= 100.0
    q, scale = quantize_reference(x)
    error = (dequantize_reference(q, scale) - x).abs()
    bound = torch.maximum(2 ** -4 * x.abs(), 2 ** -10 * scale[..., None])
    assert (error <= bound * (1 + 1e-6)).all()
    assert (q.float().abs().amax(-1) == FP8_MAX).all()     # each row's amax hits 448
    normal = x.abs() >= 2 ** -6 * scale[..., None]
    assert (error[normal] / x.abs()[normal]).max() > 2 ** -5   # the bound is not loose


def write_rows(cache, rows, layer=0):
    """Write rows [N, D] as token i, head 0 (head 1 gets the negated row)."""
    key = torch.stack([rows, -rows], dim=1)
    slots = torch.arange(len(rows))
    cache.write(layer, key.to(DEVICE), key.flip(0).to(DEVICE), slots.to(DEVICE))
    return key, slots


def test_write_rounds_every_value_tie_and_carry_like_torch():
    grid = e4m3_values()
    grid = grid[grid.abs() <= FP8_MAX]
    positive = grid[grid > 0].sort().values
    ties = (positive[1:] + positive[:-1]) / 2
    nudged = torch.cat([ties.nextafter(torch.tensor(math.inf)),
                        ties.nextafter(torch.tensor(-math.inf))])
    values = torch.cat([grid, ties, -ties, nudged, -nudged, torch.tensor([460.0, -500.0])])
    rows = rows_with_scale_one(values, 64)
    cache = Fp8PagedKVCache(1, blocks_needed(len(rows), 16), 16, 2, 64, DEVICE)
    key, slots = write_rows(cache, rows)
    stored = cache.storage[0, 0].view(torch.uint8).flatten(0, 1)[slots.to(DEVICE)].cpu()
    expected, scale = quantize_reference(key)
    assert torch.equal(stored, expected.view(torch.uint8))
    assert torch.equal(cache.scales[0, 0].transpose(1, 2).flatten(0, 1)[slots].cpu(), scale)


@pytest.mark.parametrize("heads,dim", [(1, 16), (3, 24), (2, 64)])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_write_matches_reference_and_skips(heads, dim, index_dtype):
    gen = torch.Generator().manual_seed(heads * dim)
    cache = Fp8PagedKVCache(2, 5, 4, heads, dim, DEVICE)
    n = 13
    slots = torch.randperm(cache.num_slots, generator=gen)[:n].to(index_dtype)
    slots[[2, 7]] = -1
    key = torch.randn(n, heads, dim, generator=gen).half()
    value = torch.randn(n, heads, dim, generator=gen).half() * 1e-3
    cache.write(1, key.to(DEVICE), value.to(DEVICE), slots.to(DEVICE))
    keep = slots >= 0
    blocks, offsets = slots[keep].long() // 4, slots[keep].long() % 4
    for plane, x in enumerate((key, value)):
        q, s = quantize_reference(x[keep])
        got = cache.storage[1, plane].view(torch.uint8)[blocks.to(DEVICE),
                                                        offsets.to(DEVICE)].cpu()
        assert torch.equal(got, q.view(torch.uint8))
        assert torch.equal(cache.scales[1, plane][blocks, :, offsets].cpu(), s)
    written = torch.zeros(cache.num_slots, dtype=torch.bool)
    written[slots[keep].long()] = True
    assert (cache.key_cache(1).view(torch.uint8).flatten(0, 1)[~written.to(DEVICE)] == 0).all()
    assert (cache.storage[0].float() == 0).all() and (cache.scales[0] == 1).all()


def test_write_errors_leave_the_cache_unchanged():
    cache = Fp8PagedKVCache(1, 2, 4, 2, 16, DEVICE)
    good = torch.ones(2, 2, 16, device=DEVICE)
    before = cache.storage.clone(), cache.scales.clone()
    with pytest.raises(KVCacheError, match="slots in"):
        cache.write(0, good, good, torch.tensor([0, 8]))
    with pytest.raises(KVCacheError, match="shape"):
        cache.write(0, good[:, :1], good, torch.tensor([0, 1], device=DEVICE))
    with pytest.raises(KVCacheError, match="layer"):
        cache.write(3, good, good, torch.tensor([0, 1], device=DEVICE))
    assert torch.equal(cache.storage.view(torch.uint8), before[0].view(torch.uint8))
    assert torch.equal(cache.scales, before[1])


def test_gather_checks_and_dequantizes():
    cache = Fp8PagedKVCache(2, 4, 4, 1, 8, DEVICE)
    x = torch.randn(6, 1, 8) * 10
    cache.write(1, x.to(DEVICE), (-x).to(DEVICE), torch.tensor([8, 9, 10, 11, 0, 1]))
    key, value = cache.gather(1, [2, 0], 6)
    q, s = quantize_reference(x)
    assert torch.equal(key.cpu(), dequantize_reference(q, s)) and key.dtype == torch.float32
    assert torch.equal(value.cpu(), -key.cpu())
    with pytest.raises(KVCacheError, match="cannot hold"):
        cache.gather(1, [2, 0], 9)
    with pytest.raises(KVCacheError, match="cannot hold"):
        cache.gather(1, [[2, 0]], 1)
    with pytest.raises(KVCacheError, match="layer"):
        cache.gather(2, [2, 0], 6)


def attention_case(lengths, block_size, kv_heads, group, dim, seed, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    blocks = [blocks_needed(n, block_size) for n in lengths]
    cache = Fp8PagedKVCache(2, sum(blocks) + 2, block_size, kv_heads, dim, DEVICE)
    pool = torch.randperm(cache.num_blocks, generator=gen).tolist()
    tables = torch.full((len(lengths), max(blocks) + 1), pool[-1], dtype=torch.int32)
    for b, (n, nb) in enumerate(zip(lengths, blocks)):
        tables[b, :nb] = torch.tensor([pool.pop(0) for _ in range(nb)], dtype=torch.int32)
        pos = torch.arange(n)
        slots = tables[b].long()[pos // block_size] * block_size + pos % block_size
        k = torch.randn(n, kv_heads, dim, generator=gen)
        k[:, :, 1] *= 30.0
        cache.write(1, k.to(DEVICE), torch.randn(n, kv_heads, dim, generator=gen).to(DEVICE),
                    slots.to(DEVICE))
    query = torch.randn(len(lengths), kv_heads * group, dim, generator=gen).to(dtype)
    lens = torch.tensor(lengths, dtype=torch.int32)
    return query.to(DEVICE), cache, tables.to(DEVICE), lens.to(DEVICE)


@pytest.mark.parametrize("block_size,kv_heads,group,dim", [(1, 1, 1, 16), (4, 2, 4, 32),
                                                           (16, 2, 2, 64), (32, 1, 8, 16)])
def test_paged_attention_matches_the_dequantized_reference(block_size, kv_heads, group, dim):
    query, cache, tables, lens = attention_case([0, 1, block_size + 1, 45], block_size,
                                                kv_heads, group, dim, seed=block_size)
    ref = paged_attention_reference(query, cache, 1, tables, lens)
    for splits in (1, 2, None):
        out = cache.paged_attention(query, 1, tables, lens, num_splits=splits)
        assert out.dtype == query.dtype and out.shape == query.shape
        assert (out - ref).abs().max() < 1e-4, splits
    assert (out[0] == 0).all()                           # length 0: zeros
    scaled = cache.paged_attention(query, 1, tables, lens, scale=0.5, num_splits=1)
    ref = paged_attention_reference(query, cache, 1, tables, lens, scale=0.5)
    assert (scaled - ref).abs().max() < 1e-4


def test_wide_tables_and_ragged_lengths_change_nothing():
    """Each program cuts its own sequence's length (chapter 8): a table as wide as a CUDA
    graph's gives the same answer, whatever the split."""
    query, cache, tables, lens = attention_case([3, 70, 1, 33], 4, 2, 4, 32, seed=5)
    ref = paged_attention_reference(query, cache, 1, tables, lens)
    wide = torch.cat([tables, tables[:, :1].expand(-1, 300)], 1)
    for splits in (None, 3, 8):
        out = cache.paged_attention(query, 1, wide, lens, num_splits=splits)
        assert (out - ref).abs().max() < 1e-4, splits


def test_paged_attention_fp16_query():
    query, cache, tables, lens = attention_case([5, 20], 4, 2, 2, 32, seed=3,
                                                dtype=torch.float16)
    ref = paged_attention_reference(query, cache, 1, tables, lens)
    out = cache.paged_attention(query, 1, tables, lens)
    assert out.dtype == torch.float16
    assert ((out.float() - ref).norm() / ref.norm()) < 4 * 2 ** -8


@triton.jit
def _pairs_kernel(words_ptr, low_ptr, high_ptr, n, BLOCK: tl.constexpr,
                  INTERPRETED: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    low, high = fp8._e4m3_pairs(tl.load(words_ptr + offsets, mask=mask), INTERPRETED)
    tl.store(low_ptr + offsets, low.to(tl.float32), mask=mask)
    tl.store(high_ptr + offsets, high.to(tl.float32), mask=mask)


def test_e4m3_pairs_convert_every_word_exactly():
    """Every int16 word of two finite e4m3 bytes gives both values exactly, low byte
    first (the interpreter's bit moves on the CPU, the FP8 instruction on a GPU)."""
    words = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16)
    as_bytes = words.view(torch.uint8).view(-1, 2).view(FP8_DTYPE).float()
    keep = torch.isfinite(as_bytes).all(1)
    words, expected = words[keep].to(DEVICE), as_bytes[keep]
    low = torch.empty(len(words), device=DEVICE)
    high = torch.empty_like(low)
    _pairs_kernel[(triton.cdiv(len(words), 4096),)](
        words, low, high, len(words), BLOCK=4096, INTERPRETED=DEVICE.type != "cuda")
    assert len(words) == 254 * 254
    assert torch.equal(low.cpu(), expected[:, 0]) and torch.equal(high.cpu(), expected[:, 1])


def test_odd_head_dim_is_refused():
    cache = Fp8PagedKVCache(1, 2, 4, 1, 3, DEVICE)
    query = torch.randn(1, 1, 3, device=DEVICE)
    tables = torch.zeros(1, 1, dtype=torch.int32, device=DEVICE)
    lens = torch.ones(1, dtype=torch.int32, device=DEVICE)
    with pytest.raises(PagedAttentionError, match="head_dim must be even"):
        cache.paged_attention(query, 0, tables, lens)


def test_paged_attention_errors():
    query, cache, tables, lens = attention_case([5, 9], 4, 2, 2, 16, seed=4)
    with pytest.raises(PagedAttentionError, match="query must be"):
        cache.paged_attention(query[:, :, :8], 1, tables, lens)
    with pytest.raises(PagedAttentionError, match="fp32/fp16/bf16"):
        cache.paged_attention(query.double(), 1, tables, lens)
    with pytest.raises(PagedAttentionError, match="block_tables"):
        cache.paged_attention(query, 1, tables.long(), lens)
    if lens.device.type == "cpu":
        with pytest.raises(PagedAttentionError, match="seq_lens"):
            cache.paged_attention(query, 1, tables, lens + 100)
    with pytest.raises(KVCacheError, match="layer"):
        cache.paged_attention(query, 5, tables, lens)


# Scales must travel with their blocks: a random sequence of writes, copy-on-write copies and
# swaps out and in, checked against a model of what every block (on the GPU and in the CPU pool)
# must decode to. The poisoned scales of freshly zeroed blocks expose any copy that forgets them.

OPS = st.lists(st.tuples(st.sampled_from(["write", "copy", "swap_out", "swap_in"]),
                         st.integers(0, 5), st.integers(0, 5), st.integers(0, 1000)),
               min_size=1, max_size=10)


@settings(max_examples=12, deadline=None)
@given(ops=OPS)
def test_scales_move_with_copy_on_write_and_swap(ops):
    bs, heads, dim = 2, 2, 8
    gpu = Fp8PagedKVCache(2, 6, bs, heads, dim, DEVICE)
    cpu = gpu.cpu_pool(6)
    gpu.scales.fill_(7.0)                                # poison: never a real scale here
    cpu.scales.fill_(7.0)
    expected = {"gpu": {}, "cpu": {}}                    # block -> [L, 2, bs, H, D] fp32

    def decoded(cache, block):
        return torch.stack([torch.stack(cache.gather(layer, [block], bs))
                            for layer in range(2)]).cpu()

    for op, a, b, seed in ops:
        if op == "write":
            gen = torch.Generator().manual_seed(seed)
            x = torch.randn(2, 2, bs, heads, dim, generator=gen) * (seed % 7 + 1)
            slots = torch.arange(a * bs, a * bs + bs, device=DEVICE)
            for layer in range(2):
                gpu.write(layer, x[layer, 0].to(DEVICE), x[layer, 1].to(DEVICE), slots)
            expected["gpu"][a] = dequantize_reference(*quantize_reference(x))
        elif op == "copy" and a in expected["gpu"] and a != b:
            gpu.copy_blocks([(a, b)])
            expected["gpu"][b] = expected["gpu"][a]
        elif op == "swap_out" and a in expected["gpu"]:
            gpu.swap_out(cpu, [(a, b)])
            expected["cpu"][b] = expected["gpu"][a]
        elif op == "swap_in" and a in expected["cpu"]:
            cpu_block, gpu_block = a, b
            gpu.swap_in(cpu, [(cpu_block, gpu_block)])
            expected["gpu"][gpu_block] = expected["cpu"][cpu_block]
        for name, cache in (("gpu", gpu), ("cpu", cpu)):
            for block, want in expected[name].items():
                assert torch.equal(decoded(cache, block), want), (name, block, op)


def test_swap_with_a_plain_pool_is_refused():
    gpu = Fp8PagedKVCache(1, 2, 2, 1, 8, DEVICE)
    plain = fp8.PagedKVCache(1, 2, 2, 1, 8, torch.float32, "cpu")
    with pytest.raises(KVCacheError, match="fp8 pool"):
        gpu.swap_out(plain, [(0, 0)])


def test_sizes_count_the_scales():
    cache = Fp8PagedKVCache(3, 10, 16, 2, 64, DEVICE)
    per_token = fp8_bytes_per_token(3, 2, 64)
    assert per_token == 2 * 3 * 2 * (64 + 4)
    assert cache.nbytes == per_token * cache.num_slots


# The engine on a tiny random model.

@pytest.fixture(scope="module")
def tiny():
    from minipaged.model.qwen3 import random_qwen3, tiny_qwen3_config

    return random_qwen3(tiny_qwen3_config(), seed=0, device=DEVICE)


def LLM(model, **options) -> LLMEngine:
    """Chapter 13's engine: chapter 12's, with the FP8 cache format among its parts."""
    return LLMEngine(model, parts=EngineParts().with_cache_format("fp8", FP8_CACHE), **options)


FP8_CACHE = CacheFormat(new_fp8_cache, fp8_block_bytes)


def test_engine_fp8_runs_frees_and_mostly_agrees(tiny):
    from minipaged import SamplingParams

    rng = random.Random(0)
    prompts = [[rng.randrange(512) for _ in range(rng.randint(5, 30))] for _ in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    tokens = {}
    for dtype in ("auto", "fp8"):
        llm = LLM(tiny, kv_cache_dtype=dtype, num_blocks=40, block_size=4,
                  check_invariants=True)
        outputs = llm.generate(prompts, params, use_tqdm=False)
        tokens[dtype] = [o.outputs[0].token_ids for o in outputs]
        assert llm.manager.num_free_blocks == 40
        assert isinstance(llm.cache, Fp8PagedKVCache) == (dtype == "fp8")
    assert len(set(map(tuple, tokens["auto"]))) > 1          # not a degenerate model
    # the first token comes from the prefill, which reads nothing back from the cache
    assert [t[0] for t in tokens["auto"]] == [t[0] for t in tokens["fp8"]]
    assert tokens["auto"] != tokens["fp8"]          # the fp8 cache is really in use


def test_teacher_forced_greedy_tokens_mostly_agree(tiny):
    """Fed the same tokens, the fp8 cache's decode steps pick the full-precision argmax
    nearly always (free-running runs diverge at the first flip: not a fair measure)."""
    from minipaged.model.qwen3 import ForwardBatch, Qwen3PagedModel

    model = Qwen3PagedModel.from_hf(tiny)
    rng = random.Random(1)
    prompt, steps = 12, 24
    seqs = [[rng.randrange(512) for _ in range(prompt + steps)] for _ in range(4)]
    tables = [list(range(i * 9, i * 9 + 9)) for i in range(4)]
    c = tiny.config
    cache = Fp8PagedKVCache(c.num_hidden_layers, 36, 4, c.num_key_value_heads, c.head_dim,
                            DEVICE)
    batch = ForwardBatch.from_sequences([s[:prompt] for s in seqs], [0] * 4, tables, 4,
                                        DEVICE)
    logits = [model(batch, cache).float()]
    for pos in range(prompt, prompt + steps - 1):
        batch = ForwardBatch.from_sequences([s[pos:pos + 1] for s in seqs], [pos] * 4,
                                            tables, 4, DEVICE)
        logits.append(model(batch, cache).float())
    logits = torch.stack(logits, 1)
    with torch.no_grad():
        reference = tiny(torch.tensor(seqs, device=DEVICE)).logits[:, prompt - 1:-1].float()
    agree = (logits.argmax(-1) == reference.argmax(-1)).float().mean().item()
    distance = ((logits - reference).norm(dim=-1) / reference.norm(dim=-1)).median().item()
    assert agree >= 0.85, agree
    assert 1e-4 < distance < 0.1, distance                  # quantized, and not broken


def test_engine_block_bytes_are_the_caches_bytes(tiny):
    llm = LLM(tiny, kv_cache_dtype="fp8", num_blocks=8, block_size=4)
    assert FP8_CACHE.block_bytes(llm.model, 4) * 8 == llm.cache.nbytes
    auto = LLM(tiny, num_blocks=8, block_size=4)
    assert MODEL_DTYPE_CACHE.block_bytes(auto.model, 4) * 8 == auto.cache.nbytes
    c = tiny.config
    per_token = fp8_bytes_per_token(c.num_hidden_layers, c.num_key_value_heads, c.head_dim)
    assert FP8_CACHE.block_bytes(llm.model, 16) == 16 * per_token


def test_bad_kv_cache_dtype_and_missing_fp8_allocate_nothing(tiny, monkeypatch):
    made = []
    real_init = Fp8PagedKVCache.__init__
    monkeypatch.setattr(Fp8PagedKVCache, "__init__",
                        lambda self, *a, **k: made.append(1) or real_init(self, *a, **k))
    for bad in ("fp8_e5m2", "int8", None):
        with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
            LLM(tiny, kv_cache_dtype=bad)
    monkeypatch.setattr(fp8, "fp8_supported", lambda device: False)
    with pytest.raises(KVCacheError, match="8.9"):
        LLM(tiny, kv_cache_dtype="fp8", num_blocks=8)
    assert made == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_write_and_decode_are_cuda_graph_capturable():
    query, cache, tables, lens = attention_case([7, 300, 64], 16, 2, 4, 128, seed=5,
                                                dtype=torch.bfloat16)
    key = torch.randn(3, 2, 128, device="cuda", dtype=torch.bfloat16)
    slots = torch.tensor([7, -1, 64 + 5], device="cuda")
    eager = cache.paged_attention(query, 1, tables, lens)      # compiles outside the capture
    cache.write(0, key, key, slots)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cache.write(0, key, key, slots)
        captured = cache.paged_attention(query, 1, tables, lens)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)


def test_bench_fp8_quick_runs_end_to_end(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, str(root / "benchmarks/bench_fp8.py"), "--quick",
                           "--check", "--skip-engine", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "fp8_h200.json").read_text())
    assert result["check"]["failures"] == [] and len(result["kernel"]) == 2
    assert all(r["fp8_bytes"] < r["bf16_bytes"] for r in result["kernel"])
