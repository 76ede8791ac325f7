"""Unit tests of minipaged.model.qwen3: the paged Qwen3 against transformers, offline, on a tiny model."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach the network

import pytest
import torch

from minipaged.model.qwen3 import (ATTENTION_TOLERANCE, ForwardBatch, HubUnavailableError,
                                   Qwen3PagedModel, RMSNorm, UnsupportedConfigError, apply_rope,
                                   attention_parity, greedy_generate, load_hub_qwen3,
                                   reference_greedy, random_qwen3, rope_cos_sin, tiny_qwen3_config)

PROMPT_LENGTHS = (1, 2, 3, 5, 11)


@pytest.fixture(scope="module")
def hf_model():
    return random_qwen3(tiny_qwen3_config(), seed=0)


@pytest.fixture(scope="module")
def model(hf_model):
    return Qwen3PagedModel.from_hf(hf_model)


@pytest.fixture(scope="module")
def prompts():
    rng = torch.Generator().manual_seed(7)
    return [torch.randint(0, 512, (n,), generator=rng).tolist() for n in PROMPT_LENGTHS]


@pytest.fixture(scope="module")
def reference(hf_model, prompts):
    tokens, logits = reference_greedy(hf_model, prompts, 10)
    assert all(len(set(t)) > 3 for t in tokens), f"degenerate reference output: {tokens}"
    return tokens, logits


def test_rmsnorm_and_rope_match_transformers_exactly(hf_model):
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, apply_rotary_pos_emb

    x = torch.randn(6, 4, 16) * 5
    ours, theirs = RMSNorm(16), Qwen3RMSNorm(16)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 2.0)
        theirs.weight.copy_(ours.weight)
    assert torch.equal(ours(x), theirs(x))
    positions = torch.tensor([0, 3, 1, 99, 500, 2])
    rotary = hf_model.model.rotary_emb
    cos, sin = rope_cos_sin(positions, rotary.inv_freq, torch.float32)
    hf_cos, hf_sin = rotary(x, positions[None])
    assert torch.equal(cos, hf_cos[0]) and torch.equal(sin, hf_sin[0])
    theirs_q, _ = apply_rotary_pos_emb(x.transpose(0, 1)[None], x.transpose(0, 1)[None], hf_cos, hf_sin)
    assert torch.equal(apply_rope(x, cos, sin), theirs_q[0].transpose(0, 1))


def test_forward_batch_positions_slots_and_errors():
    batch = ForwardBatch.from_sequences([[1, 2, 3], [4], [5, 6, 7]], [0, 4, 2],
                                        [[7, 1], [4, 0, 6], [3, 5, 2]], block_size=2)
    assert batch.positions.tolist() == [0, 1, 2, 4, 2, 3, 4]
    assert batch.slot_mapping.tolist() == [14, 15, 2, 12, 10, 11, 4]
    assert batch.seq_lens.tolist() == [3, 5, 5] and batch.seq_lens.dtype == torch.int32
    assert batch.block_tables.dtype == torch.int32 and batch.logits_indices.tolist() == [2, 3, 6]
    assert not batch.is_decode
    assert ForwardBatch.from_sequences([[1], [2]], [3, 0], [[0, 1], [2]], block_size=2).is_decode
    with pytest.raises(ValueError, match="cannot hold"):
        ForwardBatch.from_sequences([[1, 2, 3]], [0], [[5]], block_size=2)
    ids = torch.tensor([1, 2])
    with pytest.raises(ValueError, match="slot_mapping must have shape"):
        ForwardBatch(ids, ids, torch.tensor([0]), (2,), (0,))
    with pytest.raises(ValueError, match="at least one new token"):
        ForwardBatch(ids, ids, ids, (2, 0), (0, 0))
    with pytest.raises(ValueError, match="block_tables and seq_lens are required"):
        ForwardBatch(ids, ids, ids, (1, 1), (0, 0))


def test_weights_are_shared_and_tied_head_is_one_tensor():
    hf = random_qwen3(tiny_qwen3_config(tie_word_embeddings=True), seed=1)
    model = Qwen3PagedModel.from_hf(hf)
    assert model.lm_head.weight is model.embed_tokens.weight
    assert model.embed_tokens.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    assert model.layers[1].mlp.down_proj.weight.data_ptr() == hf.model.layers[1].mlp.down_proj.weight.data_ptr()
    # the tied model is also token-identical to transformers
    prompts = [[5, 9, 100, 3], [77]]
    ref_tokens, _ = reference_greedy(hf, prompts, 6)
    trace = greedy_generate(model, model.new_cache(32, 2), prompts, 6, keep_logits=False)
    assert trace.tokens == ref_tokens


def test_from_state_dict_rejects_a_foreign_state_dict(hf_model):
    state = dict(hf_model.state_dict())
    state["model.layers.0.self_attn.extra.weight"] = torch.zeros(1)
    with pytest.raises(ValueError, match="unexpected"):
        Qwen3PagedModel.from_state_dict(hf_model.config, state)


@pytest.mark.parametrize("block_size", [2, 16])
def test_every_layer_attention_matches_eager(model, hf_model, prompts, block_size):
    errors = attention_parity(model, hf_model, prompts, block_size=block_size)
    assert len(errors) == hf_model.config.num_hidden_layers
    assert max(errors) < ATTENTION_TOLERANCE[torch.float32], errors


@pytest.mark.parametrize("block_size", [1, 2, 16])
def test_greedy_tokens_and_step_logits_match_generate(model, prompts, reference, block_size):
    ref_tokens, ref_logits = reference
    trace = greedy_generate(model, model.new_cache(96, block_size), prompts, 10,
                            arrivals=[0, 3, 0, 1, 6], seed=block_size)
    assert trace.tokens == ref_tokens
    assert trace.decode_steps > 0 and trace.mixed_steps > 0
    for mine, ref in zip(trace.logits, ref_logits):
        torch.testing.assert_close(torch.stack(mine), ref, rtol=1e-5, atol=2e-5)


def test_blocks_of_interleaved_sequences_are_scattered_and_reused(model, prompts):
    trace = greedy_generate(model, model.new_cache(40, 2), prompts, 10, arrivals=[0, 0, 0, 0, 9])
    owners = {}
    for tables in trace.tables_per_step:
        blocks = [b for t in tables.values() for b in t]
        assert len(blocks) == len(set(blocks)), "a block owned by two live sequences"
        for seq, table in tables.items():
            for b in table:
                owners.setdefault(b, set()).add(seq)
    assert any(len(s) > 1 for s in owners.values()), "freed blocks were never reused"
    first = trace.tables_per_step[-1]
    assert any(t != list(range(t[0], t[0] + len(t))) for t in first.values())


def test_pool_too_small_raises(model, prompts):
    with pytest.raises(RuntimeError, match="cache exhausted"):
        greedy_generate(model, model.new_cache(4, 2), prompts, 10)


@pytest.mark.parametrize("split", [1, 4, 5, 10])
def test_cached_prefix_gives_the_logits_of_a_full_prefill(model, split):
    prompt = list(range(40, 51))
    table = [9, 3, 14, 0, 7, 12]
    full = model(ForwardBatch.from_sequences([prompt], [0], [table], 2), model.new_cache(16, 2))
    cache = model.new_cache(16, 2)
    model(ForwardBatch.from_sequences([prompt[:split]], [0], [table], 2), cache)
    suffix = model(ForwardBatch.from_sequences([prompt[split:]], [split], [table], 2), cache)
    torch.testing.assert_close(suffix, full, rtol=1e-5, atol=1e-5)


def test_logits_at_every_prompt_position_match_transformers(model, hf_model, prompts):
    batch = ForwardBatch.from_sequences(prompts, [0] * len(prompts),
                                        [list(range(i * 8, i * 8 + 6)) for i in range(len(prompts))], 2)
    batch.logits_indices = torch.arange(batch.num_tokens)
    ours = model(batch, model.new_cache(64, 2))
    with torch.inference_mode():
        theirs = torch.cat([hf_model(torch.tensor([p])).logits[0] for p in prompts])
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=2e-5)


def test_unsupported_configs_are_refused():
    with pytest.raises(UnsupportedConfigError, match="rope_type"):
        Qwen3PagedModel(tiny_qwen3_config(rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                            "rope_theta": 10000.0}))
    with pytest.raises(UnsupportedConfigError, match="sliding"):
        Qwen3PagedModel(tiny_qwen3_config(use_sliding_window=True, sliding_window=8))


def test_hub_loader_fails_with_an_actionable_error_offline():
    with pytest.raises(HubUnavailableError, match="random_qwen3"):
        load_hub_qwen3("Qwen/Qwen3-0.6B-not-downloaded", local_files_only=True)


def test_prefill_attention_keeps_sdpa_off_cudnn(monkeypatch):
    """cuDNN's SDPA plans anew for every prompt length (slow prefill on a GPU): prefill must not use it."""
    import torch.nn.functional as F

    from minipaged.model.qwen3 import prefill_attention
    from minipaged.kernels.kv_cache import PagedKVCache

    enabled_before = torch.backends.cuda.cudnn_sdp_enabled()
    seen, real = [], F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append((torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled()))
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    cache = PagedKVCache(1, 8, 2, 2, 16, torch.float32, "cpu")
    batch = ForwardBatch.from_sequences([[1, 2, 3], [4, 5]], [0, 2], [[0, 1], [2, 3]], 2)
    q, k = torch.randn(5, 4, 16), torch.randn(5, 2, 16)
    out = prefill_attention(q, k, k.clone(), batch, cache, 0, 0.25)
    assert out.shape == (5, 4, 16) and torch.isfinite(out).all()
    assert seen == [(False, True), (False, True)]          # one call per sequence, never cuDNN
    assert torch.backends.cuda.cudnn_sdp_enabled() == enabled_before   # restored afterwards


def test_fp16_parity_within_its_tolerance(prompts):
    """The fp16 path (the chapter's dtype on GPUs without native bf16, a T4) stays in bounds."""
    from minipaged.model.qwen3 import LOGITS_TOLERANCE

    assert ATTENTION_TOLERANCE[torch.float32] < ATTENTION_TOLERANCE[torch.float16] \
        < ATTENTION_TOLERANCE[torch.bfloat16]
    assert LOGITS_TOLERANCE[torch.float16] < LOGITS_TOLERANCE[torch.bfloat16]
    hf = random_qwen3(tiny_qwen3_config(), seed=0, dtype=torch.float16)
    errors = attention_parity(Qwen3PagedModel.from_hf(hf), hf, prompts, block_size=2)
    assert max(errors) < ATTENTION_TOLERANCE[torch.float16], errors
