"""Chapter 9 reference solutions."""

import copy
import math

import torch

from minipaged.model.qwen3 import Qwen3PagedModel, rope_inv_freq


def from_hf_linear_rope(hf_model) -> Qwen3PagedModel:
    config = copy.deepcopy(hf_model.config)
    rope = dict(config.rope_parameters)
    factor = float(rope["factor"])
    config.rope_parameters = {"rope_type": "default", "rope_theta": rope["rope_theta"]}
    model = Qwen3PagedModel.from_state_dict(config, hf_model.state_dict())
    # Position interpolation: angle (p / factor) * theta**(-2i/D), i.e. inv_freq / factor.
    model.inv_freq = rope_inv_freq(config.head_dim, model.rope_theta).to(model.device) / factor
    return model


def check_rope(rope) -> None:
    from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

    theta, heads, dim = 10000.0, 2, 16
    x = torch.randn(6, heads, dim, generator=torch.Generator().manual_seed(0))
    positions = torch.tensor([0, 1, 5, 37, 300, 2])
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    angles = positions[:, None].float() * inv_freq[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    heads_first = x.transpose(0, 1)[None]
    want, _ = apply_rotary_pos_emb(heads_first, heads_first, angles.cos()[None],
                                   angles.sin()[None])
    got = rope(x, positions)
    assert got.shape == x.shape
    assert torch.allclose(got[0], x[0], atol=1e-6), "position 0 must not rotate"
    assert torch.allclose(got, want[0].transpose(0, 1), atol=1e-5), "differs from Qwen3's"


def _weights(config) -> tuple[int, int, int]:
    """(matrix weights of all layers, LM head weights, K/V bytes per token) in bf16."""
    layer = (2 * config.hidden_size * config.num_attention_heads * config.head_dim
             + 2 * config.hidden_size * config.num_key_value_heads * config.head_dim
             + 3 * config.hidden_size * config.intermediate_size)
    kv = config.num_hidden_layers * 2 * config.num_key_value_heads * config.head_dim * 2
    return config.num_hidden_layers * layer, config.hidden_size * config.vocab_size, kv


def _per_sequence(config, context_len: int) -> tuple[float, float]:
    matrices, head, kv = _weights(config)
    attention = (config.num_hidden_layers * 4 * config.num_attention_heads
                 * config.head_dim * (context_len + 1))
    return 2 * matrices + 2 * head + attention, kv * (context_len + 1)


def decode_intensity(config, batch: int, context_len: int) -> float:
    matrices, head, _ = _weights(config)
    flops, kv_bytes = _per_sequence(config, context_len)
    return batch * flops / (2 * (matrices + head) + batch * kv_bytes)


def ridge_batch(config, context_len: int, ridge: float) -> int | None:
    flops, kv_bytes = _per_sequence(config, context_len)
    if flops / kv_bytes <= ridge:   # the limit of an infinite batch stays below the ridge
        return None
    # batch * flops / (weights + batch * kv) >= ridge  <=>  batch >= ridge * weights / (...)
    matrices, head, _ = _weights(config)
    batch = math.ceil(ridge * 2 * (matrices + head) / (flops - ridge * kv_bytes))
    while batch > 1 and decode_intensity(config, batch - 1, context_len) >= ridge:
        batch -= 1
    while decode_intensity(config, batch, context_len) < ridge:
        batch += 1
    return batch
