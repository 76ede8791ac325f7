# GENERATED from chapters/14_fast_engine.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/14_fast_engine.md § QK-norm and RoPE in one kernel
"""A faster Qwen3 on the paged cache: chapter 9's model with fused kernels, same outputs.

The model computes what chapter 9's does, with fewer kernels: the fused glue of
``minipaged.kernels.fused_ops``, one GEMM for q/k/v and one for gate/up. The KV cache is
written through its own ``write`` and decode reads go through ``paged_decode``, so any
cache with chapter 7's interface serves it. Prefill runs chapter 9's
``prefill_attention`` unless the model is given a prefill part (``plan_prefill``:
chapter 15's paged prefill kernel is one).
"""

from __future__ import annotations

import torch
from torch import nn

from minipaged.kernels.fused_ops import (add_rms_norm, add_rms_norm_reference, qk_norm_rope,
                                         silu_mul)
from minipaged.kernels.kv_cache import PagedKVCache
from minipaged.model.qwen3 import (ForwardBatch, Qwen3PagedAttention, Qwen3PagedLayer,
                                   Qwen3PagedMLP, Qwen3PagedModel, apply_rope, paged_decode,
                                   prefill_attention, rope_cos_sin)

__all__ = ["qk_norm_rope_reference", "fuse_linears", "fused_weight_bytes",
           "FastQwen3Attention", "FastQwen3MLP", "FastQwen3Layer", "FastQwen3Model",
           "as_fast_model"]


def qk_norm_rope_reference(qkv: torch.Tensor, num_heads: int, num_kv_heads: int,
                           q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
                           cos: torch.Tensor, sin: torch.Tensor, eps: float
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unfused: split ``qkv [N, (Hq + 2 Hkv) D]``; RMSNorm and rotate q and k per head.

    Weights ``None`` (a Llama model, no QK-norm): rotate only. Returns
    ``q [N, Hq, D]``, ``k [N, Hkv, D]`` and ``v [N, Hkv, D]`` (a view).
    """
    n, head_dim = qkv.shape[0], cos.shape[-1]
    q, k, v = qkv.split([num_heads * head_dim, num_kv_heads * head_dim,
                         num_kv_heads * head_dim], dim=-1)
    q = q.reshape(n, num_heads, head_dim)
    k = k.reshape(n, num_kv_heads, head_dim)
    if q_weight is not None:
        q, _ = add_rms_norm_reference(q, None, q_weight, eps)
        k, _ = add_rms_norm_reference(k, None, k_weight, eps)
    return (apply_rope(q, cos, sin), apply_rope(k, cos, sin),
            v.view(n, num_kv_heads, head_dim))


# %% chapters/14_fast_engine.md § Fused projections
def fuse_linears(*linears: nn.Linear) -> nn.Linear:
    """One ``nn.Linear`` whose output is the outputs of ``linears`` side by side.

    The weights (and biases) are concatenated once, into new tensors.
    """
    weight = torch.cat([linear.weight for linear in linears])
    has_bias = linears[0].bias is not None
    if any((linear.bias is not None) != has_bias for linear in linears):
        raise ValueError("fuse_linears needs all linears with a bias or all without")
    with torch.device("meta"):
        fused = nn.Linear(weight.shape[1], weight.shape[0], bias=has_bias)
    fused.weight = nn.Parameter(weight, requires_grad=False)
    if has_bias:
        fused.bias = nn.Parameter(torch.cat([linear.bias for linear in linears]),
                                  requires_grad=False)
    return fused


def fused_weight_bytes(config, dtype_bytes: int) -> int:
    """Bytes of the concatenated QKV and gate/up weights of all layers."""
    c = config
    qkv = (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim
    per_layer = (qkv + 2 * c.intermediate_size) * c.hidden_size * dtype_bytes
    return c.num_hidden_layers * per_layer


# %% chapters/14_fast_engine.md § The fast model
class FastQwen3Attention(nn.Module):
    """Chapter 9's attention with one QKV GEMM and the fused QK-norm + RoPE kernel."""

    def __init__(self, attn: Qwen3PagedAttention) -> None:
        super().__init__()
        self.layer_idx = attn.layer_idx
        self.num_heads, self.num_kv_heads = attn.num_heads, attn.num_kv_heads
        self.head_dim, self.scale = attn.head_dim, attn.scale
        self.qkv_proj = fuse_linears(attn.q_proj, attn.k_proj, attn.v_proj)
        self.o_proj, self.q_norm, self.k_norm = attn.o_proj, attn.q_norm, attn.k_norm

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                batch: ForwardBatch, cache: PagedKVCache,
                plan=None) -> torch.Tensor:
        """``plan`` given (by a prefill part): prefill with ``plan.attend``; else chapter
        9's paths."""
        n = x.shape[0]
        norm = self.q_norm is not None  # a Llama has no QK-norm: RoPE only
        q, k, v = qk_norm_rope(self.qkv_proj(x), self.num_heads, self.num_kv_heads,
                               self.q_norm.weight if norm else None,
                               self.k_norm.weight if norm else None, cos, sin,
                               self.q_norm.eps if norm else 0.0)
        cache.write(self.layer_idx, k, v, batch.slot_mapping)
        if batch.is_decode:
            o = paged_decode(q, cache, self.layer_idx, batch.block_tables,
                             batch.seq_lens, self.scale)
        elif plan is not None:
            o = plan.attend(q, cache, self.layer_idx, batch, self.scale)
        else:
            o = prefill_attention(q, k, v, batch, cache, self.layer_idx, self.scale)
        return self.o_proj(o.reshape(n, self.num_heads * self.head_dim))


class FastQwen3MLP(nn.Module):
    """SwiGLU with one gate/up GEMM and the fused SiLU · up kernel."""

    def __init__(self, mlp: Qwen3PagedMLP) -> None:
        super().__init__()
        self.gate_up_proj = fuse_linears(mlp.gate_proj, mlp.up_proj)
        self.down_proj = mlp.down_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_mul(self.gate_up_proj(x)))


# %% chapters/14_fast_engine.md § The fast model
class FastQwen3Layer(nn.Module):
    """Decoder layer whose residual adds are fused into the following RMSNorm."""

    def __init__(self, layer: Qwen3PagedLayer) -> None:
        super().__init__()
        self.input_layernorm = layer.input_layernorm
        self.self_attn = FastQwen3Attention(layer.self_attn)
        self.post_attention_layernorm = layer.post_attention_layernorm
        self.mlp = FastQwen3MLP(layer.mlp)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, cos: torch.Tensor,
                sin: torch.Tensor, batch: ForwardBatch, cache: PagedKVCache,
                plan=None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mlp output, residual)``; their sum is chapter 9's layer output."""
        norm = self.input_layernorm
        x, residual = add_rms_norm(x, residual, norm.weight, norm.eps)
        x = self.self_attn(x, cos, sin, batch, cache, plan)
        norm = self.post_attention_layernorm
        x, residual = add_rms_norm(x, residual, norm.weight, norm.eps)
        return self.mlp(x), residual


# %% chapters/14_fast_engine.md § The fast model
class FastQwen3Model(Qwen3PagedModel):
    """Chapter 9's model with fused glue kernels and fused projections, same outputs.

    Prefill runs chapter 9's ``prefill_attention``, unless ``plan_prefill`` (a prefill
    part) returns a plan for the batch: ``plan.attend`` then computes every layer's.
    """

    plan_prefill = None
    """The prefill part: ``plan_prefill(batch, cache, dtype)`` -> a plan or None."""

    @classmethod
    def from_paged(cls, model: Qwen3PagedModel, plan_prefill=None) -> FastQwen3Model:
        """The fast twin of ``model``; every tensor not fused is shared with it.
        ``plan_prefill``: the prefill part, if any (chapter 15's paged kernel)."""
        with torch.device("meta"):  # the layers are replaced below: build nothing real
            fast = cls(model.config)
        fast.embed_tokens, fast.norm = model.embed_tokens, model.norm
        fast.lm_head = model.lm_head
        fast.layers = nn.ModuleList(FastQwen3Layer(layer) for layer in model.layers)
        fast.inv_freq = model.inv_freq
        fast.plan_prefill = plan_prefill
        return fast.eval().requires_grad_(False)

    @classmethod
    def from_state_dict(cls, config, state_dict: dict[str, torch.Tensor]
                        ) -> FastQwen3Model:
        """Build from a transformers ``Qwen3ForCausalLM`` state dict (chapter 9's)."""
        return cls.from_paged(Qwen3PagedModel.from_state_dict(config, state_dict))

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, cache: PagedKVCache) -> torch.Tensor:
        x = self.embed_tokens(batch.input_ids)
        cos, sin = rope_cos_sin(batch.positions, self.inv_freq, x.dtype)
        residual, plan = None, None
        if not batch.is_decode and self.plan_prefill is not None:
            plan = self.plan_prefill(batch, cache, x.dtype)
        for layer in self.layers:
            x, residual = layer(x, residual, cos, sin, batch, cache, plan)
        rows = batch.logits_indices
        x, _ = add_rms_norm(x[rows], residual[rows], self.norm.weight, self.norm.eps)
        return self.lm_head(x)


# %% chapters/14_fast_engine.md § The fast engine
def as_fast_model(model: Qwen3PagedModel, plan_prefill=None) -> FastQwen3Model:
    """The engine's model part: chapter 9's paged model made fast (weights shared), with
    the prefill part ``plan_prefill`` if one is given."""
    if isinstance(model, FastQwen3Model):
        return model
    return FastQwen3Model.from_paged(model, plan_prefill)
