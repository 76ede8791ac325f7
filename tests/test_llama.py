"""The Llama family in chapter 9's paged model: configs served and refused, weights loaded,
chapter 14's fused RoPE without QK-norm, and load_model's local paths (fast: tiny models)."""

import pytest
import torch

from minipaged.model.qwen3 import (ForwardBatch, Qwen3PagedModel, UnsupportedConfigError,
                                   greedy_generate, has_qk_norm, load_model, random_llama,
                                   random_qwen3, reference_greedy, rope_cos_sin, rope_inv_freq,
                                   tiny_llama_config, tiny_qwen3_config)


@pytest.fixture(scope="module")
def hf_llama():
    return random_llama(tiny_llama_config(), seed=0)


PROMPTS = [[5, 9, 100, 3], [77], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]


def test_a_llama_has_no_qk_norm_and_a_qwen3_has_one(hf_llama):
    assert not has_qk_norm(hf_llama.config) and has_qk_norm(tiny_qwen3_config())
    model = Qwen3PagedModel.from_hf(hf_llama)
    assert model.layers[0].self_attn.q_norm is None
    assert not any("q_norm" in name or "k_norm" in name for name, _ in model.named_parameters())
    assert model.embed_tokens.weight.data_ptr() == hf_llama.model.embed_tokens.weight.data_ptr()
    assert model.rope_theta == 100000.0


@pytest.mark.parametrize("tied", [False, True])
def test_greedy_llama_matches_transformers_in_fp32(tied):
    hf = random_llama(tiny_llama_config(tie_word_embeddings=tied), seed=1)
    model = Qwen3PagedModel.from_hf(hf)
    assert (model.lm_head.weight is model.embed_tokens.weight) == tied
    reference, ref_logits = reference_greedy(hf, PROMPTS, 8)
    if not tied:  # a tied random model may be degenerate (see chapter 9's pitfall)
        assert all(len(set(t)) > 2 for t in reference), reference
    trace = greedy_generate(model, model.new_cache(32, 2), PROMPTS, 8, arrivals=[0, 2, 1])
    assert trace.tokens == reference
    for mine, ref in zip(trace.logits, ref_logits):
        assert torch.allclose(torch.stack(mine), ref, rtol=1e-4, atol=1e-4)


def test_a_llama_with_attention_bias_loads_its_biases():
    hf = random_llama(tiny_llama_config(attention_bias=True), seed=2)
    model = Qwen3PagedModel.from_hf(hf)
    assert model.layers[0].self_attn.q_proj.bias is not None
    reference, _ = reference_greedy(hf, PROMPTS[:2], 5)
    assert greedy_generate(model, model.new_cache(16, 2), PROMPTS[:2], 5).tokens == reference


@pytest.mark.parametrize("overrides, says", [
    (dict(rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0,
                           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 64}), "llama3"),
    (dict(rope_parameters={"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}), "linear"),
    (dict(mlp_bias=True), "mlp_bias"),
    (dict(hidden_act="gelu"), "gelu"),
])
def test_unsupported_llama_configs_are_refused_saying_what(overrides, says):
    with pytest.raises(UnsupportedConfigError, match=says):
        Qwen3PagedModel(tiny_llama_config(**overrides))


def test_a_model_of_neither_family_is_refused_naming_what_was_found():
    from transformers import MistralConfig, Qwen2Config

    for config, found in ((Qwen2Config(hidden_size=64, num_attention_heads=4), "qwen2"),
                          (MistralConfig(hidden_size=64, num_attention_heads=4), "mistral")):
        with pytest.raises(UnsupportedConfigError, match=f"'{found}'.*Qwen3.*Llama"):
            Qwen3PagedModel(config)
        with pytest.raises(UnsupportedConfigError, match=found):
            Qwen3PagedModel.from_state_dict(config, {})


def test_a_qwen3_state_dict_under_a_llama_config_is_refused(hf_llama):
    qwen3 = random_qwen3(tiny_qwen3_config(), seed=0)
    with pytest.raises(ValueError, match="does not match a Llama model.*unexpected.*q_norm"):
        Qwen3PagedModel.from_state_dict(hf_llama.config, qwen3.state_dict())
    with pytest.raises(ValueError, match="does not match a Qwen3 model.*missing.*q_norm"):
        Qwen3PagedModel.from_state_dict(qwen3.config, hf_llama.state_dict())


def test_fused_rope_without_qk_norm_equals_chapter_9s_rope():
    from minipaged.kernels.fused_ops import qk_norm_rope
    from minipaged.model.fast_qwen3 import qk_norm_rope_reference
    from minipaged.model.qwen3 import apply_rope

    torch.manual_seed(0)
    hq, hkv, d, n = 3, 1, 24, 5
    qkv = torch.randn(n, (hq + 2 * hkv) * d)
    cos, sin = rope_cos_sin(torch.arange(n) + 11, rope_inv_freq(d, 1e5), torch.float32)
    q, k, v = qk_norm_rope(qkv, hq, hkv, None, None, cos, sin, 0.0)
    q_ref, k_ref, v_ref = qk_norm_rope_reference(qkv, hq, hkv, None, None, cos, sin, 0.0)
    plain_q = apply_rope(qkv[:, :hq * d].reshape(n, hq, d), cos, sin)
    assert torch.allclose(q, plain_q, atol=1e-6) and torch.allclose(q_ref, plain_q, atol=1e-6)
    assert torch.allclose(k, k_ref, atol=1e-6) and torch.equal(v, v_ref)
    with pytest.raises(ValueError, match="both QK-norm weights"):
        qk_norm_rope(qkv, hq, hkv, torch.ones(d), None, cos, sin, 1e-6)


def test_the_fast_model_serves_a_llama(hf_llama):
    from minipaged.model.fast_qwen3 import as_fast_model

    fast = as_fast_model(Qwen3PagedModel.from_hf(hf_llama))
    assert fast.layers[0].self_attn.q_norm is None
    reference, _ = reference_greedy(hf_llama, PROMPTS, 6)
    assert greedy_generate(fast, fast.new_cache(32, 2), PROMPTS, 6,
                           arrivals=[0, 1, 0]).tokens == reference


def test_load_model_reads_a_local_transformers_folder(hf_llama, tmp_path, capsys):
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models

    hf_llama.save_pretrained(tmp_path)
    vocab = {f"t{i}": i for i in range(512)}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, "t0")))
    tokenizer.save_pretrained(tmp_path)
    model, loaded_tokenizer = load_model(tmp_path, dtype=torch.float32)
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    assert loaded_tokenizer.convert_tokens_to_ids("t7") == 7
    for name, tensor in hf_llama.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    assert capsys.readouterr().out == ""  # only the packaged model announces itself


def test_load_model_refuses_a_missing_gguf_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        load_model(tmp_path / "absent.gguf")
    assert not (tmp_path / "absent.gguf").exists()
