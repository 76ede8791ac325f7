"""Chapters 14 and 15: the fused kernels against their references (interpreter at small, odd sizes), the
fast model against chapter 9's and transformers, the fast engine against transformers."""

import functools
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import minipaged
import minipaged.kernels.prefill_attention as prefill_module
import minipaged.engine.sampler
from minipaged.engine.llm_engine import LLMEngine
from minipaged.entrypoints.llm import LLM as PackageLLM

# The fast parts are Triton kernels; on a CPU attention_backend="auto" would choose PyTorch.
LLM = functools.partial(PackageLLM, attention_backend="triton")
from minipaged.kernels.fused_ops import (add_rms_norm, add_rms_norm_reference, qk_norm_rope,
                                        silu_mul, silu_mul_reference)
from minipaged.kernels.prefill_attention import (PrefillPlan, paged_prefill_attention,
                                                 plan_paged_prefill, reads_pool_directly)
from minipaged.model.fast_qwen3 import (FastQwen3Model, fuse_linears, fused_weight_bytes,
                                        qk_norm_rope_reference)
from minipaged.memory.block_table import blocks_needed
from minipaged.kernels.kv_cache import PagedKVCache
from minipaged.model.qwen3 import (ForwardBatch, Qwen3PagedModel, greedy_generate,
                                   prefill_attention, random_qwen3, reference_greedy, rope_cos_sin,
                                   rope_inv_freq, tiny_qwen3_config)
from minipaged.engine.scheduler import SamplingParams

NEW = 6
DTYPES = [torch.float32, torch.float16]


def rel_error(got, want):
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


# -- the kernels -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, hidden", [(1, 48), (3, 64), (5, 100), (2, 7)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_add_rms_norm_matches_reference(dtype, n, hidden, with_residual):
    gen = torch.Generator().manual_seed(n * hidden)
    x, r = (torch.randn(n, hidden, generator=gen).to(dtype) for _ in range(2))
    w = torch.randn(hidden, generator=gen).to(dtype)
    res = r if with_residual else None
    want_out, want_res = add_rms_norm_reference(x, res, w, 1e-6)
    got_out, got_res = add_rms_norm(x, res, w, 1e-6)
    assert torch.equal(got_res, want_res)
    assert got_out.dtype == dtype and rel_error(got_out, want_out) < (1e-6 if dtype == torch.float32 else 2e-3)
    assert torch.equal(x, x.clone()) and (res is None or not torch.equal(got_res, r))


def test_add_rms_norm_reads_strided_rows_and_leaves_inputs_alone():
    x = torch.randn(4, 80)[:, :40]                       # rows with a stride of 80
    r, w = torch.randn(4, 40), torch.randn(40)
    before = (x.clone(), r.clone())
    want = add_rms_norm_reference(x, r, w, 1e-5)
    got = add_rms_norm(x, r, w, 1e-5)
    assert torch.allclose(got[0], want[0], atol=1e-6) and torch.equal(got[1], want[1])
    assert torch.equal(x, before[0]) and torch.equal(r, before[1])


def test_add_rms_norm_handles_large_fp16_values_in_fp32():
    x = torch.full((2, 24), 400.0, dtype=torch.float16)   # x * x overflows fp16
    w = torch.ones(24, dtype=torch.float16)
    out, _ = add_rms_norm(x, None, w, 1e-6)
    assert torch.allclose(out.float(), torch.ones(2, 24), atol=1e-3)


@pytest.mark.parametrize("bad", [dict(x=torch.randn(3)), dict(weight=torch.randn(5)),
                                 dict(residual=torch.randn(2, 8))])
def test_add_rms_norm_rejects_bad_shapes(bad):
    args = dict(x=torch.randn(3, 8), residual=None, weight=torch.randn(8)) | bad
    with pytest.raises(ValueError, match="must be"):
        add_rms_norm(args["x"], args["residual"], args["weight"], 1e-6)


@settings(max_examples=10, deadline=None)
@given(n=st.integers(1, 4), hidden=st.integers(2, 70), residual=st.booleans(),
       eps=st.sampled_from([1e-6, 1e-2, 1.0]))
def test_add_rms_norm_random_sizes(n, hidden, residual, eps):
    x, r, w = torch.randn(n, hidden), torch.randn(n, hidden), torch.randn(hidden)
    want = add_rms_norm_reference(x, r if residual else None, w, eps)
    got = add_rms_norm(x, r if residual else None, w, eps)
    assert torch.allclose(got[0], want[0], rtol=1e-5, atol=1e-6) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq, hkv, d", [(4, 2, 16), (3, 1, 24), (6, 3, 10), (1, 1, 2)])
def test_qk_norm_rope_matches_reference(dtype, hq, hkv, d):
    gen = torch.Generator().manual_seed(hq * 100 + d)
    n = 3
    qkv = torch.randn(n, (hq + 2 * hkv) * d, generator=gen).to(dtype)
    qw, kw = (1 + 0.3 * torch.randn(d, generator=gen)).to(dtype), torch.randn(d, generator=gen).to(dtype)
    cos, sin = rope_cos_sin(torch.tensor([0, 7, 300]), rope_inv_freq(d, 1e4), dtype)
    args = (qkv, hq, hkv, qw, kw, cos, sin, 1e-6)
    want, got = qk_norm_rope_reference(*args), qk_norm_rope(*args)
    assert [g.shape for g in got] == [w.shape for w in want]
    assert torch.equal(got[2], want[2]) and got[2].data_ptr() == qkv.data_ptr() + (hq + hkv) * d * qkv.element_size()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert rel_error(got[0], want[0]) < tol and rel_error(got[1], want[1]) < tol


def test_qk_norm_rope_rejects_a_wrong_width_or_odd_head_dim():
    cos, sin = rope_cos_sin(torch.arange(2), rope_inv_freq(16, 1e4), torch.float32)
    with pytest.raises(ValueError, match="qkv must be"):
        qk_norm_rope(torch.randn(2, 100), 4, 2, torch.ones(16), torch.ones(16), cos, sin, 1e-6)
    with pytest.raises(ValueError, match="even head_dim"):
        qk_norm_rope(torch.randn(2, 15), 1, 1, torch.ones(5), torch.ones(5), cos, sin, 1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, inner, block", [(3, 48, 16), (2, 100, 32), (1, 5, 1024), (4, 64, 64)])
def test_silu_mul_matches_reference(dtype, n, inner, block):
    gate_up = torch.randn(n, 2 * inner).to(dtype)
    want = silu_mul_reference(gate_up)
    got = silu_mul(gate_up, block)
    assert got.shape == (n, inner) and rel_error(got, want) < (1e-6 if dtype == torch.float32 else 2e-3)


def test_silu_mul_rejects_an_odd_width():
    with pytest.raises(ValueError, match=r"\[N, 2I\]"):
        silu_mul(torch.randn(2, 7))


def test_kernels_take_zero_tokens():
    out, res = add_rms_norm(torch.empty(0, 8), None, torch.ones(8), 1e-6)
    assert out.shape == res.shape == (0, 8)
    assert silu_mul(torch.empty(0, 8)).shape == (0, 4)


# -- the paged prefill kernel -------------------------------------------------------------------

def prefill_case(hq, hkv, d, block_size, layout, dtype, query_lens, context_lens, seed=0):
    gen = torch.Generator().manual_seed(seed)
    need = [blocks_needed(q + c, block_size) for q, c in zip(query_lens, context_lens)]
    pool = sum(need) + 8
    cache = PagedKVCache(2, pool, block_size, hkv, d, dtype, "cpu", layout)
    cache.storage.copy_(torch.randn(cache.storage.shape, generator=gen))
    free = torch.randperm(pool, generator=gen).tolist()
    tables = [[free.pop() for _ in range(n)] for n in need]
    batch = ForwardBatch.from_sequences([[0] * q for q in query_lens], context_lens, tables,
                                        block_size)
    n = sum(query_lens)
    q, k, v = (torch.randn(n, h, d, generator=gen).to(dtype) for h in (hq, hkv, hkv))
    cache.write(1, k, v, batch.slot_mapping)
    return q, k, v, batch, cache


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq, hkv, d, block_size, layout", [
    (4, 2, 16, 4, "NHD"), (3, 1, 24, 3, "HND"), (2, 2, 8, 16, "NHD"), (6, 2, 12, 5, "HND")])
def test_paged_prefill_matches_chapter_9s_prefill(dtype, hq, hkv, d, block_size, layout):
    q, k, v, batch, cache = prefill_case(hq, hkv, d, block_size, layout, dtype,
                                         [5, 17, 1, 33], [0, 6, 9, 20])
    want = prefill_attention(q, k, v, batch, cache, 1, d ** -0.5)
    got = paged_prefill_attention(q, cache, 1, batch, d ** -0.5)
    assert rel_error(got, want) < (1e-5 if dtype == torch.float32 else 5e-3)


@settings(max_examples=8, deadline=None)
@given(lens=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 40)), min_size=1, max_size=4),
       block_size=st.sampled_from([1, 2, 3, 4, 16]), seed=st.integers(0, 100))
def test_paged_prefill_random_batches(lens, block_size, seed):
    q_lens, ctx = [a for a, _ in lens], [b for _, b in lens]
    q, k, v, batch, cache = prefill_case(4, 2, 16, block_size, "NHD", torch.float32, q_lens, ctx,
                                         seed)
    want = prefill_attention(q, k, v, batch, cache, 1, 0.25)
    got = paged_prefill_attention(q, cache, 1, batch, 0.25)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


def test_prefill_plan_tiles_every_token_once():
    batch = ForwardBatch.from_sequences([[0] * 5, [0] * 40, [0]], [0, 3, 9], [[0, 1], [2] * 11, [3] * 3], 4)
    plan = PrefillPlan.for_batch(batch, 16)
    assert plan.tile_seq.tolist() == [0, 1, 1, 1, 2] and plan.tile_start.tolist() == [0, 0, 16, 32, 0]
    assert plan.seq_meta.tolist() == [[0, 5, 45], [5, 40, 1], [0, 3, 9]]


@pytest.mark.parametrize("num_seqs", [1, 2, 3, 5, 6, 7])
def test_prefill_plan_rows_start_aligned_whatever_the_tile_count(num_seqs):
    """Triton specializes pointers on 16-byte alignment: an unaligned ``tile_start`` would
    compile a second copy of the kernel mid-serving."""
    batch = ForwardBatch.from_sequences([[0] * 3] * num_seqs, [0] * num_seqs,
                                        [[i] for i in range(num_seqs)], 4)
    plan = PrefillPlan.for_batch(batch, 16)
    assert plan.tile_seq.tolist() == list(range(num_seqs)) and len(plan.tile_start) == num_seqs
    assert plan.tile_seq.data_ptr() % 16 == 0 and plan.tile_start.data_ptr() % 16 == 0


def test_only_a_plain_cache_in_the_query_dtype_is_read_directly():
    cache = PagedKVCache(1, 4, 4, 2, 16, torch.float32, "cpu")
    assert reads_pool_directly(cache, torch.float32) and not reads_pool_directly(cache, torch.float16)

    class OwnFormat(PagedKVCache):
        def gather(self, *args, **kwargs):
            return super().gather(*args, **kwargs)

    assert not reads_pool_directly(OwnFormat(1, 4, 4, 2, 16, torch.float32, "cpu"), torch.float32)


# -- fused projections ------------------------------------------------------------------------

def test_fuse_linears_stacks_outputs_and_biases():
    parts = [torch.nn.Linear(16, n, bias=True) for n in (8, 4, 4)]
    fused = fuse_linears(*parts)
    x = torch.randn(3, 16)
    assert torch.allclose(fused(x), torch.cat([p(x) for p in parts], -1), atol=1e-6)
    with pytest.raises(ValueError, match="bias"):
        fuse_linears(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4, bias=False))


def test_fused_weight_bytes_counts_qkv_and_gate_up():
    c = tiny_qwen3_config()
    with torch.device("meta"):
        fast = FastQwen3Model.from_paged(Qwen3PagedModel(c))
    stacked = sum(p.numel() for name, p in fast.named_parameters()
                  if "qkv_proj" in name or "gate_up_proj" in name)
    assert fused_weight_bytes(c, 4) == 4 * stacked


# -- the fast model ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def setup():
    hf = random_qwen3(tiny_qwen3_config(), seed=0, dtype=torch.float32)
    rng = random.Random(0)
    prompts = [[rng.randrange(512) for _ in range(n)] for n in (5, 17, 33, 9, 2)]
    reference, _ = reference_greedy(hf, prompts, NEW)
    assert all(len(set(t)) > 2 for t in reference), "degenerate reference output"
    return hf, prompts, reference


def test_fast_model_shares_what_it_does_not_fuse(setup):
    hf, _, _ = setup
    paged = Qwen3PagedModel.from_hf(hf)
    fast = FastQwen3Model.from_paged(paged)
    assert isinstance(fast, Qwen3PagedModel) and fast.device.type == "cpu"
    assert all(p.device.type == "cpu" for p in fast.parameters())
    own = {p.data_ptr() for p in paged.parameters()}
    new = [n for n, p in fast.named_parameters() if p.data_ptr() not in own]
    assert new and all("qkv_proj" in n or "gate_up_proj" in n for n in new)
    assert sum(p.numel() for p in fast.parameters()) == sum(p.numel() for p in paged.parameters())
    assert fast.inv_freq is paged.inv_freq


@pytest.mark.parametrize("config", [dict(attention_bias=True), dict(hidden_size=48, head_dim=12)])
def test_fast_model_equals_chapter_9_token_for_token(config):
    hf = random_qwen3(tiny_qwen3_config(**config), seed=1, dtype=torch.float32)
    paged, fast = Qwen3PagedModel.from_hf(hf), FastQwen3Model.from_hf(hf)
    assert isinstance(fast, FastQwen3Model)
    rng = random.Random(1)
    prompts = [[rng.randrange(512) for _ in range(n)] for n in (7, 3, 12)]
    runs = [greedy_generate(m, m.new_cache(48, 4), prompts, 5, arrivals=[0, 1, 1])
            for m in (paged, fast)]
    assert runs[0].tokens == runs[1].tokens and runs[1].mixed_steps > 0
    for ours, theirs in zip(runs[1].logits, runs[0].logits):
        for a, b in zip(ours, theirs):
            assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)
    assert runs[1].tokens == reference_greedy(hf, prompts, 5)[0]


class SpyCache(PagedKVCache):
    """A cache with its own decode reader and gather, as chapter 13's: the fast model must use
    them (and so keep chapter 9's prefill, which reads a prefix through ``gather``)."""

    writes = reads = gathers = 0

    def gather(self, *args, **kwargs):
        type(self).gathers += 1
        return super().gather(*args, **kwargs)

    def write(self, *args, **kwargs):
        type(self).writes += 1
        return super().write(*args, **kwargs)

    def paged_attention(self, query, layer, block_tables, seq_lens, scale=None):
        from minipaged.kernels.decode_attention import paged_attention

        type(self).reads += 1
        return paged_attention(query, self, layer, block_tables, seq_lens, scale=scale)


def test_fast_model_writes_and_reads_through_the_cache(setup):
    hf, prompts, reference = setup
    fast = FastQwen3Model.from_hf(hf)
    c = fast.config
    cache = SpyCache(c.num_hidden_layers, 64, 4, c.num_key_value_heads, c.head_dim, fast.dtype, "cpu")
    trace = greedy_generate(fast, cache, prompts, NEW)
    assert trace.tokens == reference
    assert SpyCache.writes == NEW * c.num_hidden_layers
    assert SpyCache.reads == (NEW - 1) * c.num_hidden_layers
    shared = [prompts[2] + [7, 8], prompts[2] + [9]]
    trace = greedy_generate(fast, cache, shared, 2, arrivals=[0, 1])   # the second reads a prefix
    assert SpyCache.gathers > 0 and trace.tokens == reference_greedy(hf, shared, 2)[0]


def test_paged_prefill_on_and_off_give_the_same_tokens(setup, monkeypatch):
    hf, prompts, reference = setup
    fast = FastQwen3Model.from_paged(Qwen3PagedModel.from_hf(hf), plan_paged_prefill)
    calls = []
    original = prefill_module.paged_prefill_attention
    monkeypatch.setattr(prefill_module, "paged_prefill_attention",
                        lambda *a, **k: calls.append(1) or original(*a, **k))
    on = greedy_generate(fast, fast.new_cache(64, 4), prompts, NEW, arrivals=[0, 0, 1, 2, 2])
    assert calls and on.tokens == reference
    fast.plan_prefill = None                     # chapter 14's model: chapter 9's prefill
    calls.clear()
    off = greedy_generate(fast, fast.new_cache(64, 4), prompts, NEW, arrivals=[0, 0, 1, 2, 2])
    assert not calls and off.tokens == reference


# -- the fast engine --------------------------------------------------------------------------

GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True)


def tokens(outputs):
    return [o.outputs[0].token_ids for o in outputs]


def test_the_package_llm_is_chapter_12s_engine_with_the_fast_parts(setup):
    from minipaged.engine.fused_sampler import FusedSampler
    from minipaged.engine.overlap_scheduler import OverlapScheduler, OverlapStepLoop
    from minipaged.entrypoints.llm import FAST_PARTS

    assert minipaged.LLM is PackageLLM and not issubclass(PackageLLM, LLMEngine)
    llm = LLM(setup[0], block_size=4)
    engine = llm.llm_engine
    assert type(engine) is LLMEngine and isinstance(engine.model, FastQwen3Model)
    assert engine.model.plan_prefill is plan_paged_prefill    # chapter 15's part, given
    assert type(engine.runner.sampler) is FusedSampler
    assert type(engine.scheduler) is OverlapScheduler and type(engine.loop) is OverlapStepLoop
    assert sorted(FAST_PARTS.cache_formats) == ["auto", "fp8"]


# Greedy parity with prefix caching on and off, prefix hits and preemption by recompute and
# swap run for this engine too in tests/test_engine.py (parametrized over both engines).


def test_fast_engine_chunked_prefill_reads_earlier_chunks_from_the_pool(setup):
    hf, prompts, reference = setup
    llm = LLM(hf, block_size=4, enable_chunked_prefill=True, max_num_batched_tokens=8,
              check_invariants=True)
    assert tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == reference


@pytest.mark.parametrize("paged_prefill", [True, False])
def test_a_step_of_decodes_and_prefill_chunks_is_one_forward_with_paged_prefill(
        setup, paged_prefill, monkeypatch):
    hf, prompts, reference = setup
    llm = LLM(hf, block_size=4, max_num_batched_tokens=8, check_invariants=True)
    if not paged_prefill:
        llm.model.plan_prefill = None            # chapter 14's model as chapter 14 builds it
    assert llm.scheduler.config.enable_chunked_prefill            # the fast engine's default
    forwards, mixed = [], []
    hook = llm.model.register_forward_pre_hook(lambda module, args: forwards.append(1))
    runner = llm.llm_engine.runner
    groups = runner.groups
    monkeypatch.setattr(runner, "groups", lambda chunks: mixed.append(
        len({c.num_tokens == 1 for c in chunks}) == 2) or groups(chunks))
    assert tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == reference
    hook.remove()
    steps = llm.last_run_stats()["steps"]
    assert sum(mixed) > 0                                          # steps did mix both kinds
    assert len(forwards) == (steps if paged_prefill else steps + sum(mixed))
    assert LLMEngine(hf, block_size=4, enable_chunked_prefill=True
                     ).scheduler.config.enable_chunked_prefill
    assert not LLMEngine(hf, block_size=4).scheduler.config.enable_chunked_prefill


def test_fast_engine_cancellations_mid_run(setup):
    hf, prompts, reference = setup
    llm = LLM(hf, block_size=4, max_num_seqs=2, check_invariants=True)
    ids = [llm.add_request(p, GREEDY) for p in prompts]
    llm.step()
    llm.step()
    victim = llm.scheduler.running[0].request_id
    outputs = {victim: llm.abort_request(victim)}
    while llm.has_unfinished_requests():
        outputs.update((o.request_id, o) for o in llm.step())
    for i, ref in zip(ids, reference):
        out = outputs[i].outputs[0]
        assert out.token_ids == (ref[:len(out.token_ids)] if i == victim else ref)
    assert llm.manager.num_free_blocks == llm.manager.num_physical_blocks


def test_fast_engine_takes_a_fast_model_as_is(setup):
    hf, prompts, reference = setup
    fast = FastQwen3Model.from_hf(hf)
    llm = LLM(fast, block_size=4)
    assert llm.model is fast
    assert tokens(llm.generate(prompts[:2], GREEDY, use_tqdm=False)) == reference[:2]


# -- the benchmark scripts (tiny sizes on the CPU; no timing is asserted) ----------------------

def test_profile_engine_sorts_kernels_into_classes():
    from benchmarks.profile_engine import kernel_class

    names = {
        "_paged_decode_kernel": "attention", "merge_splits_kernel": "attention",
        "pytorch_flash::flash_fwd_kernel": "attention",
        "nvjet_tst_128x64_64x4_1x2_h_bz_coopA_NNT": "GEMM",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64": "GEMM",
        "_add_rms_norm_kernel": "glue", "_qk_norm_rope_kernel": "glue", "_silu_mul_kernel": "glue",
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>": "glue",
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, MeanOps<float>>>": "glue",
        "void at::native::(anonymous namespace)::CatArrayBatchedCopy<...>": "glue",
        "Memcpy HtoD (Pinned -> Device)": "copies", "Memset (Device)": "copies",
        "_write_kv_kernel": "copies",
        "void at::native::unrolled_elementwise_kernel<direct_copy_kernel_cuda>": "copies",
        "void at::native::index_elementwise_kernel": "glue",
        "void at::native::argmax_kernel": "other",
    }
    for name, cls in names.items():
        assert kernel_class(name) == cls, name


def test_bench_fast_engine_kernels_quick_run(tmp_path):
    import json
    import subprocess
    import sys

    from tests.conftest import ROOT

    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/bench_fast_engine.py"), "--quick",
                           "--mode", "kernels", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "fused_kernels_cpu.json").read_text())
    assert result["device"] == "cpu" and result["command"].startswith("python ")
    kernels = {r["kernel"] for r in result["rows"]}
    assert kernels == {"add_rms_norm", "qk_norm_rope", "silu_mul", "qkv_proj", "gate_up_proj",
                       "paged_prefill"}
    assert all(r["max_rel_error"] < 1e-5 for r in result["rows"])


def test_bench_fast_engine_workloads():
    """The course workload is greedy with one length; nano-vllm's samples at T=0.6 with
    lengths drawn per request, the same on every run."""
    import sys

    from tests.conftest import ROOT

    sys.path.insert(0, str(ROOT))
    from benchmarks.bench_fast_engine import parse_args, sampling

    course = sampling(parse_args(["--quick"]), 8, 16)
    assert course.temperature == 0.0 and course.max_tokens == 16 and course.ignore_eos
    args = parse_args(["--quick", "--workload", "nanovllm"])
    drawn = sampling(args, 50, 16)
    assert drawn == sampling(args, 50, 16) and len(drawn) == 50
    lengths = {p.max_tokens for p in drawn}
    assert min(lengths) >= 4 and max(lengths) <= 16 and len(lengths) > 5
    assert all(p.temperature == 0.6 and p.ignore_eos for p in drawn)


def test_fast_engine_beam_search_and_top_p_sampling_match_chapter_12(setup):
    """Beam search and a top-p request go through chapter 12's code: the same tokens."""
    hf, prompts, _ = setup
    fast, base = LLM(hf, block_size=2), LLMEngine(hf, block_size=2)
    ours, theirs = (e.beam_search(prompts[1], beam_width=3, max_tokens=4)[0] for e in (fast, base))
    assert ours.sequences == theirs.sequences and ours.num_cow_copies == theirs.num_cow_copies
    params = SamplingParams(n=3, temperature=1.0, top_p=0.9, seed=5, max_tokens=4,
                            ignore_eos=True)
    ours, theirs = (e.generate([prompts[2]], params, use_tqdm=False)[0] for e in (fast, base))
    assert [o.token_ids for o in ours.outputs] == [o.token_ids for o in theirs.outputs]


def test_fused_sampling_seeded_requests_ignore_the_batch(setup, monkeypatch):
    """A seeded request draws the same tokens alone and beside other requests (seeded,
    unseeded, greedy), through sample_fused and never chapter 11's sampler."""
    hf, prompts, _ = setup
    monkeypatch.setattr(minipaged.engine.sampler, "sample",
                        lambda *a: pytest.fail("chapter 11's sampler was called"))
    llm = LLM(hf, block_size=2)
    seeded = SamplingParams(n=3, temperature=0.8, seed=5, max_tokens=6, ignore_eos=True)
    alone = llm.generate([prompts[2]], seeded, use_tqdm=False)[0]
    others = [SamplingParams(temperature=1.0, seed=9, max_tokens=3, ignore_eos=True),
              SamplingParams(temperature=0.5, max_tokens=5, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)]
    batch = llm.generate([prompts[0], prompts[2], prompts[1], prompts[0]],
                         [others[0], seeded, others[1], others[2]], use_tqdm=False)
    tokens = [o.token_ids for o in alone.outputs]
    assert [o.token_ids for o in batch[1].outputs] == tokens
    assert len({tuple(t) for t in tokens}) > 1  # the n samples have their own keys
    assert llm.manager.num_free_blocks == llm.manager.num_physical_blocks


def test_sample_fused_greedy_rows_break_ties_like_argmax():
    from minipaged.kernels.fused_ops import sample_fused

    logits = torch.zeros(3, 700)
    logits[0, [5, 600]] = 2.0  # a tie across two lanes and two tiles
    logits[1, 300:] = 1.0
    logits[2] = torch.randn(700)
    inv_temperature, keys = torch.zeros(3), torch.zeros(3, dtype=torch.int64)
    tokens = sample_fused(logits, inv_temperature, keys)
    assert tokens.tolist() == logits.argmax(-1).tolist() == [5, 300, logits[2].argmax()]


def test_the_fast_engine_serves_an_fp8_cache_too():
    """kv_cache_dtype='fp8' composes with the fused model, whose paged prefill kernel
    (chapter 15) reads the e4m3 blocks and their scales."""
    from minipaged.kernels.fp8_kv_cache import Fp8PagedKVCache

    hf = random_qwen3(tiny_qwen3_config(), seed=0, dtype=torch.float32)
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]
    reference, _ = reference_greedy(hf, prompts, 6)
    llm = minipaged.LLM(hf, block_size=4, kv_cache_dtype="fp8", check_invariants=True)
    assert isinstance(llm.model, FastQwen3Model) and isinstance(llm.cache, Fp8PagedKVCache)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    outputs = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert llm.manager.num_free_blocks == llm.manager.num_physical_blocks
    assert [o[0] for o in outputs] == [r[0] for r in reference]  # the prefill's token


def test_fp8_prefill_reads_the_pool_so_prefix_hits_change_nothing(monkeypatch):
    """With the e4m3 cache the paged prefill kernel reads every key quantized, cached or
    new: prefix caching on and off give the same tokens, and chapter 9's prefill (which
    would attend over the new tokens unquantized) is never called."""
    import minipaged.model.fast_qwen3 as fast_qwen3

    def refuse(*args, **kwargs):
        raise AssertionError("chapter 9's prefill_attention was called")

    monkeypatch.setattr(fast_qwen3, "prefill_attention", refuse)
    hf = random_qwen3(tiny_qwen3_config(), seed=0, dtype=torch.float32)
    shared = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8]
    prompts = [shared + [7, 7], shared + [8], shared + [9, 9, 9]]
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    runs = {}
    for caching in (False, True):
        llm = minipaged.LLM(hf, block_size=4, kv_cache_dtype="fp8",
                            enable_prefix_caching=caching, check_invariants=True)
        first = llm.generate(prompts[:1], params, use_tqdm=False)   # fills the cache
        rest = llm.generate(prompts[1:], params, use_tqdm=False)
        runs[caching] = ([o.outputs[0].token_ids for o in first + rest],
                         llm.last_run_stats()["prefix_hit_rate"])
    assert runs[True][1] > 0.5 and runs[False][1] == 0
    assert runs[True][0] == runs[False][0]


def test_fp8_mixed_steps_read_the_decodes_through_the_prefill_kernel_alike():
    """With the e4m3 cache a mixed step's decode rows go through the paged prefill kernel:
    the same tokens as when they run apart, through the fp8 decode kernel."""
    hf = random_qwen3(tiny_qwen3_config(), seed=0, dtype=torch.float32)
    prompts = [[5, 3, 8, 1, 9, 2, 7], [4, 4, 1], [2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5]]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    runs = []
    for mixed in (True, False):
        llm = minipaged.LLM(hf, block_size=4, kv_cache_dtype="fp8", max_num_batched_tokens=6,
                            check_invariants=True)
        runner = llm.llm_engine.runner
        if not mixed:
            runner.single_forward = lambda model, cache: False   # chapter 11's two groups
        groups = []
        run_groups = runner.groups
        runner.groups = lambda chunks: groups.append(len(run_groups(chunks))) or run_groups(chunks)
        runs.append([o.outputs[0].token_ids for o in llm.generate(prompts, params,
                                                                  use_tqdm=False)])
        assert max(groups) == (1 if mixed else 2)
    assert runs[0] == runs[1]
