# GENERATED from chapters/14_fast_engine.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/14_fast_engine.md § Residual add and RMSNorm
"""Fused glue kernels of a decode step, each beside its unfused reference.

Residual add and RMSNorm in one kernel, QK-norm and RoPE in one, SiLU times the up
projection in one, and a whole batch's sampling in one (the Gumbel-max trick on Philox
noise). Chapter 14's fast model (``minipaged.model.fast_qwen3``) and fused sampler
(``minipaged.engine.fused_sampler``) are built from them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minipaged.runtime import tl, triton  # Triton, or its stand-in (chapter 0)

__all__ = ["add_rms_norm_reference", "add_rms_norm", "qk_norm_rope", "silu_mul_reference",
           "silu_mul", "sample_fused"]


# %% chapters/14_fast_engine.md § Residual add and RMSNorm
def add_rms_norm_reference(x: torch.Tensor, residual: torch.Tensor | None,
                           weight: torch.Tensor, eps: float
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Unfused: ``residual + x``, then its RMSNorm (fp32 statistics) times ``weight``.

    ``residual=None`` (the first layer) norms ``x`` itself. Returns ``(normed, new
    residual)`` in ``x``'s dtype, as chapter 9's layer computes them.
    """
    residual = x if residual is None else residual + x
    r32 = residual.float()
    normed = r32 * torch.rsqrt(r32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype), residual


# %% chapters/14_fast_engine.md § Residual add and RMSNorm
@triton.jit
def _add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, eps,
                         stride_x, stride_res, stride_out, HIDDEN: tl.constexpr,
                         BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < HIDDEN
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * HIDDEN + cols, x, mask=mask)
    x32 = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x32 * x32, axis=0) / HIDDEN + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    normed = (x32 * rstd).to(x_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols,
             (normed * w).to(out_ptr.dtype.element_ty), mask=mask)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``add_rms_norm_reference`` in one kernel, one program per row of ``x [N, H]``."""
    if x.dim() != 2 or weight.shape != x.shape[-1:]:
        raise ValueError(f"x must be [N, H] with weight [H], got {list(x.shape)} and "
                         f"{list(weight.shape)}")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual must be like x {list(x.shape)}, got "
                         f"{list(residual.shape)}")
    x = x if x.stride(-1) == 1 else x.contiguous()
    out = torch.empty_like(x)
    res_in, res_out = x, x
    if residual is not None:
        res_in = residual if residual.stride(-1) == 1 else residual.contiguous()
        res_out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if x.shape[0]:
        _add_rms_norm_kernel[(x.shape[0],)](
            x, res_in, weight, out, res_out, eps, x.stride(0), res_in.stride(0),
            out.stride(0), HIDDEN=x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]),
            HAS_RESIDUAL=residual is not None)
    return out, res_out


# %% chapters/14_fast_engine.md § QK-norm and RoPE in one kernel
@triton.jit
def _norm_rope_heads(src_ptr, dst_ptr, w_ptr, cos, sin, eps,
                     NUM_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr,
                     HALF: tl.constexpr, HALF_PAD: tl.constexpr, NORM: tl.constexpr):
    """RMSNorm (when ``NORM``) then RoPE of ``NUM_HEADS`` heads of one token (two
    half-tiles each)."""
    heads = tl.arange(0, HEADS_PAD)[:, None]
    dims = tl.arange(0, HALF_PAD)[None, :]
    mask = (heads < NUM_HEADS) & (dims < HALF)
    offs = heads * (2 * HALF) + dims
    a = tl.load(src_ptr + offs, mask=mask, other=0.0)
    dtype = a.dtype
    a = a.to(tl.float32)
    b = tl.load(src_ptr + offs + HALF, mask=mask, other=0.0).to(tl.float32)
    if NORM:
        mean_sq = (tl.sum(a * a, axis=1) + tl.sum(b * b, axis=1)) / (2 * HALF)
        rstd = (1.0 / tl.sqrt(mean_sq + eps))[:, None]
        w_a = tl.load(w_ptr + dims, mask=dims < HALF, other=0.0).to(tl.float32)
        w_b = tl.load(w_ptr + dims + HALF, mask=dims < HALF, other=0.0).to(tl.float32)
        a = ((a * rstd).to(dtype).to(tl.float32) * w_a).to(dtype).to(tl.float32)
        b = ((b * rstd).to(dtype).to(tl.float32) * w_b).to(dtype).to(tl.float32)
    tl.store(dst_ptr + offs, (a * cos - b * sin).to(dtype), mask=mask)
    tl.store(dst_ptr + offs + HALF, (b * cos + a * sin).to(dtype), mask=mask)


@triton.jit
def _qk_norm_rope_kernel(qkv_ptr, q_ptr, k_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr,
                         stride_qkv, stride_cos, eps,
                         NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
                         Q_PAD: tl.constexpr, KV_PAD: tl.constexpr,
                         HALF: tl.constexpr, HALF_PAD: tl.constexpr,
                         NORM: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    dims = tl.arange(0, HALF_PAD)[None, :]
    cos = tl.load(cos_ptr + token * stride_cos + dims, mask=dims < HALF, other=0.0)
    sin = tl.load(sin_ptr + token * stride_cos + dims, mask=dims < HALF, other=0.0)
    cos, sin = cos.to(tl.float32), sin.to(tl.float32)
    row = qkv_ptr + token * stride_qkv
    _norm_rope_heads(row, q_ptr + token * NUM_HEADS * 2 * HALF, qw_ptr, cos, sin, eps,
                     NUM_HEADS, Q_PAD, HALF, HALF_PAD, NORM)
    _norm_rope_heads(row + NUM_HEADS * 2 * HALF,
                     k_ptr + token * NUM_KV_HEADS * 2 * HALF, kw_ptr, cos, sin, eps,
                     NUM_KV_HEADS, KV_PAD, HALF, HALF_PAD, NORM)


# %% chapters/14_fast_engine.md § QK-norm and RoPE in one kernel
def qk_norm_rope(qkv: torch.Tensor, num_heads: int, num_kv_heads: int,
                 q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
                 cos: torch.Tensor, sin: torch.Tensor, eps: float
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``qk_norm_rope_reference`` in one kernel: one program per token, all its heads.

    ``cos``/``sin`` are chapter 9's ``rope_cos_sin`` tables ``[N, D]`` (both halves
    equal; the kernel reads the first). Weights ``None``: RoPE only (Llama).
    """
    n, head_dim = qkv.shape[0], cos.shape[-1]
    norm = q_weight is not None
    if norm != (k_weight is not None):
        raise ValueError("give both QK-norm weights (Qwen3) or neither (Llama)")
    width = (num_heads + 2 * num_kv_heads) * head_dim
    if qkv.dim() != 2 or qkv.shape[1] != width or head_dim % 2:
        raise ValueError(f"qkv must be [N, {width}] with an even head_dim, got "
                         f"{list(qkv.shape)} and head_dim {head_dim}")
    if qkv.stride(-1) != 1:
        qkv = qkv.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    q = qkv.new_empty(n, num_heads, head_dim)
    k = qkv.new_empty(n, num_kv_heads, head_dim)
    v = qkv[:, (num_heads + num_kv_heads) * head_dim:].view(n, num_kv_heads, head_dim)
    if n:
        half = head_dim // 2
        _qk_norm_rope_kernel[(n,)](
            qkv, q, k, q_weight if norm else qkv, k_weight if norm else qkv, cos, sin,
            qkv.stride(0), cos.stride(0), eps,
            NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads,
            Q_PAD=triton.next_power_of_2(num_heads),
            KV_PAD=triton.next_power_of_2(num_kv_heads),
            HALF=half, HALF_PAD=triton.next_power_of_2(half), NORM=norm)
    return q, k, v


# %% chapters/14_fast_engine.md § SiLU times up
def silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """Unfused: ``silu(gate) * up`` for ``gate_up = [gate | up]`` of shape [N, 2I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


@triton.jit
def _silu_mul_kernel(gate_up_ptr, out_ptr, stride_in, INNER: tl.constexpr,
                     BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < INNER
    gate = tl.load(gate_up_ptr + row * stride_in + cols, mask=mask, other=0.0)
    up = tl.load(gate_up_ptr + row * stride_in + INNER + cols, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype).to(tl.float32)
    tl.store(out_ptr + row * INNER + cols, (act * up.to(tl.float32)).to(gate.dtype),
             mask=mask)


def silu_mul(gate_up: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """``silu_mul_reference`` in one kernel over ``gate_up [N, 2I]``; returns [N, I]."""
    if gate_up.dim() != 2 or gate_up.shape[1] % 2:
        raise ValueError(f"gate_up must be [N, 2I], got {list(gate_up.shape)}")
    n, inner = gate_up.shape[0], gate_up.shape[1] // 2
    if gate_up.stride(-1) != 1:
        gate_up = gate_up.contiguous()
    out = gate_up.new_empty(n, inner)
    block = min(block, triton.next_power_of_2(inner))
    if n:
        _silu_mul_kernel[(n, triton.cdiv(inner, block))](
            gate_up, out, gate_up.stride(0), INNER=inner, BLOCK=block)
    return out


# %% chapters/14_fast_engine.md § Sampling in one kernel
@triton.jit
def _gumbel_argmax_kernel(logits_ptr, keys_ptr, inv_temp_ptr, out_ptr, stride_row, vocab,
                          BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    key = tl.load(keys_ptr + row)
    inv_temp = tl.load(inv_temp_ptr + row)  # 0: a greedy row
    noisy = inv_temp > 0
    scale = tl.where(noisy, inv_temp, 1.0)
    best = tl.full([BLOCK], -float("inf"), dtype=tl.float32)
    best_index = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(0, vocab, BLOCK):
        index = start + tl.arange(0, BLOCK)
        inside = index < vocab
        x = tl.load(logits_ptr + row * stride_row + index, mask=inside,
                    other=-float("inf")).to(tl.float32)
        gumbel = -tl.log(-tl.log(tl.rand(key, index)))
        score = tl.where(inside, x * scale + tl.where(noisy, gumbel, 0.0), -float("inf"))
        better = score > best  # strict: a lane keeps its first maximum
        best = tl.where(better, score, best)
        best_index = tl.where(better, index, best_index)
    top = tl.max(best, axis=0)
    tl.store(out_ptr + row, tl.min(tl.where(best == top, best_index, vocab), axis=0))


def sample_fused(logits: torch.Tensor, inv_temperature: torch.Tensor,
                 keys: torch.Tensor) -> torch.Tensor:
    """One token per row of ``logits [B, V]``: argmax of ``logit * inv_temperature`` plus
    Gumbel noise from Philox keyed by ``keys[row]``; rows with ``inv_temperature == 0``
    take the plain argmax."""
    rows, vocab = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    tokens = torch.empty(rows, dtype=torch.int32, device=logits.device)
    block = 4096 if logits.is_cuda else 256
    _gumbel_argmax_kernel[(rows,)](logits, keys, inv_temperature, tokens, logits.stride(0),
                                   vocab, BLOCK=min(block, triton.next_power_of_2(vocab)))
    return tokens
