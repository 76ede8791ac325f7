# GENERATED from chapters/13_fp8_kv_cache.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/13_fp8_kv_cache.md § Version 1: one scale per tensor
"""FP8 accuracy, measured: the storage schemes, synthetic and real keys, and the
teacher-forced agreement of a cache against fp32 (chapter 13's experiments; the
cache itself is `minipaged.kernels.fp8_kv_cache`)."""

from __future__ import annotations

import torch

from minipaged.kernels.fp8_kv_cache import FP8_DTYPE, FP8_MAX
from minipaged.kernels.kv_cache import PagedKVCache
from minipaged.memory.block_table import blocks_needed
from minipaged.model.qwen3 import ForwardBatch, apply_rope, rope_cos_sin

__all__ = ["SCHEMES", "accuracy_sweep", "teacher_forced", "logit_agreement",
           "RoundTripKVCache", "attention_inputs", "real_key_errors"]


# %% chapters/13_fp8_kv_cache.md § Version 1: one scale per tensor
def fp8_round_trip(x: torch.Tensor, scale) -> torch.Tensor:
    """x stored as e4m3 with `scale` (broadcast against x) and read back, in fp32."""
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).float() * scale


def per_tensor_calibrated(x: torch.Tensor, calibration_tokens: int = 64) -> torch.Tensor:
    """vLLM's on-the-fly scale: amax of the first tokens / 448, then fixed."""
    return fp8_round_trip(x, x[:calibration_tokens].abs().max() / FP8_MAX)


def per_block_first_token(x: torch.Tensor, block_size: int = 16) -> torch.Tensor:
    """One scale per (block, head), set by the block's first token."""
    t, h, d = x.shape
    blocks = x.view(t // block_size, block_size, h, d)
    scale = blocks[:, :1].abs().amax(-1, keepdim=True) / FP8_MAX
    return fp8_round_trip(blocks, scale).view(t, h, d)


def per_slot(x: torch.Tensor) -> torch.Tensor:
    """One scale per (slot, head): each stored row's own amax / 448."""
    return fp8_round_trip(x, x.abs().amax(-1, keepdim=True) / FP8_MAX)


# %% chapters/13_fp8_kv_cache.md § Keys with a few large channels
def synthetic_keys(tokens: int, heads: int, dim: int, outlier: float,
                   gen: torch.Generator, channels: int = 4,
                   spread: float = 0.5) -> torch.Tensor:
    """Keys [tokens, heads, dim]: unit normals, with `channels` channels per head
    (the same every token) `outlier` times larger, in a log-normal size per token."""
    k = torch.randn(tokens, heads, dim, generator=gen)
    big = torch.randperm(dim, generator=gen)[:channels]
    size = outlier * (spread * torch.randn(tokens, heads, 1, generator=gen)).exp()
    k[:, :, big] = size * torch.randn(tokens, heads, channels, generator=gen)
    return k


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Softmax attention of q [B, Hq, D] over k, v [T, Hkv, D], in fp32."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("bhd,thd->bht", q, k) / k.shape[-1] ** 0.5
    return torch.einsum("bht,thd->bhd", scores.softmax(-1), v)


SCHEMES = {
    "bf16": lambda x: x.bfloat16().float(),
    "fp8, one scale = 1.0": lambda x: fp8_round_trip(x, 1.0),
    "e5m2, no scale": lambda x: x.to(torch.float8_e5m2).float(),
    "fp8, one scale from 64 tokens": per_tensor_calibrated,
    "fp8, per (block, head)": per_block_first_token,
    "fp8, per (slot, head)": per_slot,
}
"""Ways of storing K/V, each a function from fp32 values to what reading them back gives."""


def accuracy_sweep(outliers=(1, 2, 4, 8, 16), tokens: int = 1024, seed: int = 0
                   ) -> tuple[list[dict], dict]:
    """Per outlier size: each scheme's attention-output error against fp32 K/V (32
    query heads, 8 KV heads, D 128), and what a scale from the first 64 tokens clips,
    ``{outlier: (share of rows, elements)}``."""
    gen = torch.Generator().manual_seed(seed)
    rows, saturated = [], {}
    for outlier in outliers:
        k = synthetic_keys(tokens, 8, 128, outlier, gen)
        v = torch.randn(tokens, 8, 128, generator=gen)
        q = torch.randn(8, 32, 128, generator=gen)
        exact = dense_attention(q, k, v)
        clipped = k.abs() > k[:64].abs().max()        # past the calibrated scale's 448
        saturated[outlier] = (clipped.any(-1).float().mean().item(), int(clipped.sum()))
        row = {"outlier x": outlier, "max |k|": k.abs().max().item()}
        for name, scheme in SCHEMES.items():
            out = dense_attention(q, scheme(k), scheme(v))
            row[name] = ((out - exact).norm() / exact.norm()).item()
        rows.append(row)
    return rows, saturated


# %% chapters/13_fp8_kv_cache.md § Accuracy end to end
def teacher_forced(model, cache, sequences: list[list[int]],
                   prompt_len: int) -> torch.Tensor:
    """Logits [B, steps, vocab] of a paged model: prefill the prompts, then decode
    the given tokens one step at a time (sequences of one length, blocks of 16)."""
    tables, start = [], 0
    for seq in sequences:
        tables.append(list(range(start, start + blocks_needed(len(seq), 16))))
        start += len(tables[-1])
    batch = ForwardBatch.from_sequences([s[:prompt_len] for s in sequences],
                                        [0] * len(sequences), tables, 16, model.device)
    logits = [model(batch, cache).float()]
    for pos in range(prompt_len, len(sequences[0]) - 1):
        batch = ForwardBatch.from_sequences([s[pos:pos + 1] for s in sequences],
                                            [pos] * len(sequences), tables, 16,
                                            model.device)
        logits.append(model(batch, cache).float())
    return torch.stack(logits, 1)


def logit_agreement(logits: torch.Tensor, reference: torch.Tensor) -> dict:
    """Share of positions with the reference's greedy token, and the relative distance
    of the logits per position (median and max)."""
    distance = (logits - reference).norm(dim=-1) / reference.norm(dim=-1)
    return {"greedy tokens agree": (logits.argmax(-1) == reference.argmax(-1))
            .float().mean().item(),
            "logit distance (median)": distance.median().item(),
            "logit distance (max)": distance.max().item()}


# %% chapters/13_fp8_kv_cache.md § A trained model's keys: SmolLM2
class RoundTripKVCache(PagedKVCache):
    """A full-precision paged cache that keeps what a storage scheme would read back.

    Every key and value written goes through ``store(layer, kind, x)`` first (``kind``
    is ``"key"`` or ``"value"``, ``x`` fp32 ``[N, H_kv, D]``), and attention (PyTorch's)
    reads the result in fp32: an emulation of a quantized cache, or a recorder."""

    def __init__(self, model, num_blocks: int, block_size: int, store) -> None:
        c = model.config
        super().__init__(c.num_hidden_layers, num_blocks, block_size,
                         c.num_key_value_heads, c.head_dim, torch.float32, model.device)
        self.store = store
        self.attention_backend = "torch"

    def write(self, layer: int, key: torch.Tensor, value: torch.Tensor,
              slot_mapping: torch.Tensor, check_slots: bool | None = None) -> None:
        """Store ``store(layer, "key", key)`` and ``store(layer, "value", value)``."""
        super().write(layer, self.store(layer, "key", key.float()),
                      self.store(layer, "value", value.float()), slot_mapping,
                      check_slots)


def row_store(scheme):
    """A ``store`` that applies a per-row scheme of ``SCHEMES`` to every write."""
    return lambda layer, kind, x: scheme(x)


class CalibratedStore:
    """vLLM's on-the-fly per-tensor scale, per layer and kind: amax / 448 of the first
    ``calibration_tokens`` rows of the first write, fixed from then on."""

    def __init__(self, calibration_tokens: int = 64) -> None:
        self.calibration_tokens = calibration_tokens
        self.scales: dict[tuple[int, str], torch.Tensor] = {}

    def __call__(self, layer: int, kind: str, x: torch.Tensor) -> torch.Tensor:
        if (layer, kind) not in self.scales:
            amax = x[:self.calibration_tokens].abs().max()
            self.scales[layer, kind] = amax / FP8_MAX
        return fp8_round_trip(x, self.scales[layer, kind])


# %% chapters/13_fp8_kv_cache.md § A trained model's keys: SmolLM2
def attention_inputs(model, token_ids: list[int]) -> list[tuple[torch.Tensor, ...]]:
    """Per layer, the queries, keys and values ``[T, H, D]`` (fp32) a paged model
    attends with over ``token_ids``: after QK-norm and RoPE, keys and values as its
    cache stores them. One prefill into a fresh recording cache."""
    n, written, queries, hooks = len(token_ids), {}, {}, []

    def record(layer, kind, x):
        written[layer, kind] = x
        return x

    for i, layer in enumerate(model.layers):
        attn = layer.self_attn
        source = attn.q_norm if attn.q_norm is not None else attn.q_proj
        hooks.append(source.register_forward_hook(
            lambda module, args, out, i=i: queries.__setitem__(i, out.detach())))
    blocks = blocks_needed(n, 16)
    try:
        batch = ForwardBatch.from_sequences([list(token_ids)], [0], [list(range(blocks))],
                                            16, model.device)
        with torch.no_grad():
            model(batch, RoundTripKVCache(model, blocks, 16, record))
    finally:
        for hook in hooks:
            hook.remove()
    cos, sin = rope_cos_sin(torch.arange(n, device=model.device), model.inv_freq,
                            torch.float32)
    heads, dim = model.config.num_attention_heads, model.config.head_dim
    return [(apply_rope(queries[i].float().view(n, heads, dim), cos, sin),
             written[i, "key"], written[i, "value"])
            for i in range(model.config.num_hidden_layers)]


# %% chapters/13_fp8_kv_cache.md § A trained model's keys: SmolLM2
def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal softmax attention of every position, q [T, Hq, D] over k, v [T, Hkv, D]."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, 1).transpose(0, 1) for t in (k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1), k, v,
                                                           is_causal=True)
    return out.transpose(0, 1)


def channel_ratio(x: torch.Tensor) -> float:
    """Largest over median per-channel amax of ``x`` [T, H, D], heads pooled."""
    amax = x.reshape(-1, x.shape[-1]).abs().amax(0)
    return (amax.max() / amax.median()).item()


def real_key_errors(layers, schemes: dict | None = None) -> list[dict]:
    """Per layer of ``attention_inputs``: the key and value channel ratios, the three
    largest key channels, and each scheme's attention-output error against fp32."""
    rows = []
    for index, (q, k, v) in enumerate(layers):
        exact = causal_attention(q, k, v)
        amax = k.reshape(-1, k.shape[-1]).abs().amax(0)
        row = {"layer": index, "key ratio": channel_ratio(k),
               "value ratio": channel_ratio(v), "top key channels": amax.topk(3)
               .indices.tolist()}
        for name, scheme in (schemes or SCHEMES).items():
            out = causal_attention(q, scheme(k), scheme(v))
            row[name] = ((out - exact).norm() / exact.norm()).item()
        rows.append(row)
    return rows
