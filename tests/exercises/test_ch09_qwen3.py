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


# --- 9.3: predictions about batched decode, against an independent count of FLOPs and bytes

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


RIDGE = 1979e12 / 2 / 4.29e12     # the chapter's: dense bf16 FLOP/s over the copy bandwidth


def _smallest_batch(c, context, limit=1 << 20):
    if _reference_intensity(c, limit, context) < RIDGE:
        return None
    lo, hi = 1, limit                        # intensity grows with the batch: bisect
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _reference_intensity(c, mid, context) >= RIDGE else (mid + 1, hi)
    return lo


def batching_truth():
    c = qwen3_0_6b_config()
    longest = 0
    while _smallest_batch(c, longest + 1) is not None:
        longest += 1
    return {"batch at context 0": _smallest_batch(c, 0),
            "batch at context 4096": _smallest_batch(c, 4096),
            "limit at context 4096": _reference_intensity(c, 1 << 40, 4096),
            "longest context": longest}


def check_batching_predictions(predicted):
    truth = batching_truth()
    assert set(predicted) == set(truth), f"predict exactly these: {sorted(truth)}"
    for name, value in truth.items():
        got = predicted[name]
        if value is None or got is None:
            assert got is value, f"{name}: you predicted {got}, the count gives {value}"
        else:
            assert abs(got - value) <= 0.1 * value, (
                f"{name}: you predicted {got}, the count gives {value:.4g}")


def test_9_3_batching_predictions():
    check_batching_predictions(ex.batching_predictions())


_RIGHT_9_3 = {"batch at context 0": 236, "batch at context 4096": None,
              "limit at context 4096": 4.5, "longest context": 44}


@pytest.mark.grader
def test_9_3_the_check_accepts_right_predictions():
    check_batching_predictions(_RIGHT_9_3)


@pytest.mark.parametrize("wrong", [
    {"batch at context 4096": 2000},            # "a batch large enough always gets there"
    {"limit at context 4096": 2.0},             # the weights' FLOPs forgotten
    {"batch at context 0": 118},                # weights read once per pair of sequences
    {"longest context": 4096},
])
@pytest.mark.grader
def test_9_3_the_check_rejects_wrong_predictions(wrong):
    with pytest.raises(AssertionError):
        check_batching_predictions({**_RIGHT_9_3, **wrong})
