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


def batching_predictions() -> dict[str, float | int | None]:
    # Weights: about 2 FLOPs per byte per sequence of the batch, so the ridge (about 231) needs
    # a batch of about 230 at context 0. Each cached token adds 4,096 bytes per layer and only
    # 4 * 16 * 128 = 8,192 FLOPs of attention per layer: 2 FLOPs per byte, so the intensity of an
    # unbounded batch is (weight FLOPs + 2 x KV bytes) / KV bytes per sequence.
    weight_flops = 2 * 0.6e9                   # per sequence and step, about
    kv_per_token = 2 * 8 * 128 * 2 * 28        # bytes
    limit = (weight_flops + 2 * kv_per_token * 4096) / (kv_per_token * 4096)
    return {"batch at context 0": 236, "batch at context 4096": None,
            "limit at context 4096": limit, "longest context": 44}
