"""Checks for the chapter 9 exercises (exercises/ch09_qwen3.py)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from minipaged.model.qwen3 import (ForwardBatch, Qwen3PagedModel, apply_rope, greedy_generate,
                                   qwen3_0_6b_config, random_qwen3, reference_greedy, rope_cos_sin,
                                   rope_inv_freq, tiny_qwen3_config)
from tests.exercises.answers import load

ex = load("ch09_qwen3")


# --- 9.1: linear RoPE scaling, graded against transformers; three wrong versions must fail


def _linear_rope_hf(factor=4.0):
    rope = {"rope_type": "linear", "factor": factor, "rope_theta": 10000.0}
    return random_qwen3(tiny_qwen3_config(rope_parameters=rope), seed=3)


def _with_inv_freq(hf, make):
    """A paged model with the default rope type and ``make(head_dim, theta, factor)``."""
    config = tiny_qwen3_config()
    model = Qwen3PagedModel.from_state_dict(config, hf.state_dict())
    model.inv_freq = make(config.head_dim, 10000.0, hf.config.rope_parameters["factor"])
    return model


PLANTED_9_1 = {
    "scaling ignored": lambda d, theta, f: rope_inv_freq(d, theta),
    "positions stretched the wrong way": lambda d, theta, f: rope_inv_freq(d, theta) * f,
    "theta scaled instead": lambda d, theta, f: rope_inv_freq(d, theta * f),
}


def _grade_linear_rope(build) -> None:
    hf = _linear_rope_hf()
    model = build(hf)
    prompts = [[(7 * i) % 500 + 1 for i in range(40)], [5, 9, 2]]
    tables = [list(range(0, 20)), list(range(20, 22))]
    batch = ForwardBatch.from_sequences(prompts, [0, 0], tables, 2)
    batch.logits_indices = torch.arange(batch.num_tokens)
    ours = model(batch, model.new_cache(24, 2))
    with torch.inference_mode():
        theirs = torch.cat([hf(torch.tensor([p])).logits[0] for p in prompts])
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=2e-5)
    ref_tokens, _ = reference_greedy(hf, prompts, 3)      # the decode path too
    trace = greedy_generate(model, model.new_cache(32, 2), prompts, 3, keep_logits=False)
    assert trace.tokens == ref_tokens


def test_9_1_linear_rope_scaling():
    for name, make in PLANTED_9_1.items():   # the grader itself rejects wrong answers
        with pytest.raises(AssertionError):
            _grade_linear_rope(lambda hf, make=make: _with_inv_freq(hf, make))
    _grade_linear_rope(ex.from_hf_linear_rope)


# --- 9.2: the learner's check must pass the chapter's RoPE and fail five planted bugs

THETA = 10000.0


def _correct(x, positions):
    cos, sin = rope_cos_sin(positions, rope_inv_freq(x.shape[-1], THETA), x.dtype)
    return apply_rope(x, cos, sin)


def _interleaved(x, positions):
    """Bug: rotates neighbouring pairs (2i, 2i+1) instead of (i, i + D/2)."""
    angles = positions[:, None].float() * rope_inv_freq(x.shape[-1], THETA)[None, :]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


def _opposite(x, positions):
    """Bug: rotates by minus the angle."""
    cos, sin = rope_cos_sin(positions, rope_inv_freq(x.shape[-1], THETA), x.dtype)
    return apply_rope(x, cos, -sin)


def _off_by_one(x, positions):
    """Bug: positions counted from 1."""
    return _correct(x, positions + 1)


def _wrong_frequencies(x, positions):
    """Bug: theta ** (-i / D) instead of theta ** (-2i / D)."""
    d = x.shape[-1]
    inv_freq = 1.0 / THETA ** (torch.arange(d // 2, dtype=torch.float32) / d)
    cos, sin = rope_cos_sin(positions, inv_freq, x.dtype)
    return apply_rope(x, cos, sin)


def _swapped(x, positions):
    """Bug: cos and sin exchanged."""
    cos, sin = rope_cos_sin(positions, rope_inv_freq(x.shape[-1], THETA), x.dtype)
    return apply_rope(x, sin, cos)


PLANTED_9_2 = [_interleaved, _opposite, _off_by_one, _wrong_frequencies, _swapped]


def test_9_2_check_rope():
    ex.check_rope(_correct)                  # a correct RoPE passes the learner's check
    for bug in PLANTED_9_2:
        with pytest.raises(AssertionError):
            ex.check_rope(bug)


# --- 9.3: batched decode intensity, against an independent count

def _reference_intensity(c, batch, context):
    layers, hidden = c.num_hidden_layers, c.hidden_size
    matrices = layers * (2 * hidden * c.num_attention_heads * c.head_dim
                         + 2 * hidden * c.num_key_value_heads * c.head_dim
                         + 3 * hidden * c.intermediate_size)
    head = hidden * c.vocab_size
    flops = batch * (2 * matrices + 2 * head
                     + layers * 4 * c.num_attention_heads * c.head_dim * (context + 1))
    kv = layers * 2 * c.num_key_value_heads * c.head_dim * 2 * (context + 1)
    return flops / (2 * (matrices + head) + batch * kv)


def test_9_3_decode_intensity_and_ridge_batch():
    shape, tiny = qwen3_0_6b_config(), tiny_qwen3_config()
    for config, batch, context in [(shape, 1, 0), (shape, 64, 300), (shape, 256, 4096),
                                   (tiny, 8, 100)]:
        assert ex.decode_intensity(config, batch, context) == pytest.approx(
            _reference_intensity(config, batch, context), rel=1e-6)
    ridge = 1979e12 / 2 / 4.29e12
    assert ex.ridge_batch(shape, 0, ridge) == 236
    assert ex.ridge_batch(shape, 4096, ridge) is None
    assert ex.ridge_batch(shape, 512, ridge) is None
    found = ex.ridge_batch(shape, 16, ridge)
    assert found is not None
    assert _reference_intensity(shape, found, 16) >= ridge
    assert _reference_intensity(shape, found - 1, 16) < ridge
