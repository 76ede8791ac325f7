# GENERATED from chapters/13_fast_engine.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/13_fast_engine.md § Residual add and RMSNorm
"""A faster Qwen3 for the engine: fused glue kernels, fused projections, paged prefill.

The model computes what chapter 9's does, with fewer kernels: residual add and RMSNorm
in one, QK-norm and RoPE in one, SiLU times the up projection in one, one GEMM for
q/k/v and one for gate/up, and prefill attention in one kernel that reads cached
prefixes straight from the block pool. The KV cache is written through its own
``write`` and decode reads go through ``paged_decode``, so any cache with chapter 7's
interface serves it. The module also holds the engine parts this chapter contributes:
the model part, a one-kernel sampler, and a scheduler and step loop that overlap the
host's work with the GPU's.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from minipaged.engine.llm_engine import StepLoop
from minipaged.kernels.fp8_kv_cache import Fp8PagedKVCache
from minipaged.kernels.kv_cache import PagedKVCache
from minipaged.model.qwen3 import (ForwardBatch, Qwen3PagedAttention, Qwen3PagedLayer,
                                   Qwen3PagedMLP, Qwen3PagedModel, apply_rope, paged_decode,
                                   prefill_attention, rope_cos_sin)
from minipaged.runtime import tl, triton  # Triton, or its stand-in (chapter 0)
from minipaged.engine.sampler import Sampler
from minipaged.engine.scheduler import Scheduler, SchedulerOutput, Sequence, SequenceStatus

__all__ = [
    "add_rms_norm_reference", "add_rms_norm", "qk_norm_rope_reference", "qk_norm_rope",
    "silu_mul_reference", "silu_mul", "fuse_linears", "fused_weight_bytes",
    "PrefillPlan", "prefill_tiles", "reads_pool_directly", "paged_prefill_attention",
    "FastQwen3Attention", "FastQwen3MLP", "FastQwen3Layer", "FastQwen3Model",
    "as_fast_model", "FusedSampler", "serves_mixed_batches", "OverlapScheduler",
    "OverlapStepLoop", "UNRESOLVED",
]


# %% chapters/13_fast_engine.md § Residual add and RMSNorm
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


# %% chapters/13_fast_engine.md § Residual add and RMSNorm
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


# %% chapters/13_fast_engine.md § QK-norm and RoPE in one kernel
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


# %% chapters/13_fast_engine.md § QK-norm and RoPE in one kernel
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


# %% chapters/13_fast_engine.md § QK-norm and RoPE in one kernel
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


# %% chapters/13_fast_engine.md § SiLU times up
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


# %% chapters/13_fast_engine.md § Fused projections
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


# %% chapters/13_fast_engine.md § A paged prefill kernel
@dataclass
class PrefillPlan:
    """Query tiles of a prefill batch, and per sequence where its tokens are.

    ``tile_seq[t]`` and ``tile_start[t]``: tile ``t``'s sequence and first new token.
    ``seq_meta`` [3, B] int32: per sequence its first row in the flat token axis, its
    query length and its cached (context) length.
    """

    tile_seq: torch.Tensor
    tile_start: torch.Tensor
    seq_meta: torch.Tensor
    block_m: int

    @classmethod
    def for_batch(cls, batch: ForwardBatch, block_m: int) -> PrefillPlan:
        seqs, starts = [], []
        for i, q_len in enumerate(batch.query_lens):
            for start in range(0, q_len, block_m):
                seqs.append(i)
                starts.append(start)
        offsets = list(itertools.accumulate(batch.query_lens, initial=0))[:-1]
        device, n = batch.input_ids.device, len(seqs)
        pad = [0] * (-n % 4)  # both rows start 16-byte aligned (see below)
        tiles = torch.tensor([seqs + pad, starts + pad], dtype=torch.int32)
        meta = torch.tensor([offsets, list(batch.query_lens), list(batch.context_lens)],
                            dtype=torch.int32)
        tiles = tiles.to(device, non_blocking=True)
        return cls(tiles[0, :n], tiles[1, :n], meta.to(device, non_blocking=True), block_m)


# %% chapters/13_fast_engine.md § A paged prefill kernel
@triton.jit(do_not_specialize=["stride_meta", "stride_table"])
def _paged_prefill_kernel(q_ptr, k_ptr, v_ptr, out_ptr, tables_ptr, tile_seq_ptr,
                          tile_start_ptr, meta_ptr, stride_meta, scale_log2, group,
                          stride_qn, stride_qh, stride_on, stride_oh, stride_table,
                          stride_block, stride_token, stride_head, ks_ptr, vs_ptr,
                          stride_sblock, stride_shead,
                          HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
                          BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, FP32_PRECISION: tl.constexpr,
                          FP8: tl.constexpr):
    tile, head = tl.program_id(0), tl.program_id(1).to(tl.int64)
    seq = tl.load(tile_seq_ptr + tile).to(tl.int64)
    first = tl.load(tile_start_ptr + tile)
    q_offset = tl.load(meta_ptr + seq).to(tl.int64)
    q_len = tl.load(meta_ptr + stride_meta + seq)
    context = tl.load(meta_ptr + 2 * stride_meta + seq)
    rows, dims = first + tl.arange(0, BLOCK_M), tl.arange(0, DIM_PAD)
    io_mask = (rows < q_len)[:, None] & (dims < HEAD_DIM)[None, :]
    q = tl.load(q_ptr + (q_offset + rows)[:, None] * stride_qn + head * stride_qh
                + dims[None, :], mask=io_mask, other=0.0)
    q_pos = context + rows
    kv_end = context + tl.minimum(first + BLOCK_M, q_len)  # the tile's last key + 1
    head_base = (head // group) * stride_head
    table_row = tables_ptr + seq * stride_table
    m = tl.full([BLOCK_M], -float("inf"), dtype=tl.float32)
    l = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, DIM_PAD], dtype=tl.float32)
    for start in range(0, kv_end, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        valid = pos < kv_end
        block = tl.load(table_row + pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
        offsets = ((block * stride_block + (pos % BLOCK_SIZE) * stride_token)[:, None]
                   + head_base + dims[None, :])
        kv_mask = valid[:, None] & (dims < HEAD_DIM)[None, :]
        k = tl.load(k_ptr + offsets, mask=kv_mask, other=0.0).to(q.dtype)
        s = tl.dot(q, tl.trans(k), input_precision=FP32_PRECISION) * scale_log2
        if FP8:  # chapter 12's per-(slot, head) scales: on scores and probabilities
            scales = (block * stride_sblock + (head // group) * stride_shead
                      + pos % BLOCK_SIZE)
            s = s * tl.load(ks_ptr + scales, mask=valid, other=0.0)[None, :]
        s = tl.where(valid[None, :] & (pos[None, :] <= q_pos[:, None]), s, -1.0e30)
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + offsets, mask=kv_mask, other=0.0).to(q.dtype)
        if FP8:
            p = p * tl.load(vs_ptr + scales, mask=valid, other=0.0)[None, :]
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v,
                                            input_precision=FP32_PRECISION)
        m = m_new
    out = acc / tl.where(l > 0, l, 1.0)[:, None]
    tl.store(out_ptr + (q_offset + rows)[:, None] * stride_on + head * stride_oh
             + dims[None, :], out.to(out_ptr.dtype.element_ty), mask=io_mask)


# %% chapters/13_fast_engine.md § A paged prefill kernel
def prefill_tiles(device: torch.device) -> tuple[int, int]:
    """(query tile, key tile) of the paged prefill kernel: 64 on a GPU, else 16."""
    return (64, 64) if device.type == "cuda" else (16, 16)


def reads_pool_directly(cache: PagedKVCache, dtype: torch.dtype) -> bool:
    """Whether ``paged_prefill_attention`` may read ``cache``'s storage: plain K/V in
    ``dtype``, or chapter 12's e4m3 blocks with their scales."""
    if type(cache) is Fp8PagedKVCache:
        return True
    return (type(cache).gather is PagedKVCache.gather
            and getattr(cache, "storage", None) is not None
            and cache.storage.dtype == dtype)


def paged_prefill_attention(query: torch.Tensor, cache: PagedKVCache, layer: int,
                            batch: ForwardBatch, scale: float,
                            plan: PrefillPlan | None = None) -> torch.Tensor:
    """``prefill_attention`` in one kernel, every key read from the pool.

    ``query`` [N, Hq, D] are the batch's new tokens, whose K/V ``cache.write`` has
    already stored; ``plan`` (built when None) cuts them into query tiles.
    """
    n, num_heads, head_dim = query.shape
    block_m, block_n = prefill_tiles(query.device)
    plan = plan or PrefillPlan.for_batch(batch, block_m)
    out = torch.empty_like(query)
    stride_block, stride_token, stride_head = cache.strides()
    fp8 = type(cache) is Fp8PagedKVCache
    scales = (cache.scales[layer, 0], cache.scales[layer, 1]) if fp8 else (out, out)
    _paged_prefill_kernel[(plan.tile_seq.shape[0], num_heads)](
        query, cache.key_cache(layer), cache.value_cache(layer), out,
        batch.block_tables, plan.tile_seq, plan.tile_start, plan.seq_meta,
        plan.seq_meta.stride(0),
        scale * 1.4426950408889634, num_heads // cache.num_kv_heads,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        batch.block_tables.stride(0), stride_block, stride_token, stride_head, *scales,
        *(cache.scale_strides() if fp8 else (0, 0)),
        HEAD_DIM=head_dim, DIM_PAD=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_SIZE=cache.block_size, BLOCK_M=plan.block_m, BLOCK_N=block_n,
        FP32_PRECISION="ieee" if query.dtype == torch.float32 else None, FP8=fp8)
    return out


# %% chapters/13_fast_engine.md § The fast model
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
                plan: PrefillPlan | None = None) -> torch.Tensor:
        """``plan`` given: prefill with the paged kernel; else chapter 9's paths."""
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
            o = paged_prefill_attention(q, cache, self.layer_idx, batch, self.scale,
                                        plan)
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


# %% chapters/13_fast_engine.md § The fast model
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
                plan: PrefillPlan | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mlp output, residual)``; their sum is chapter 9's layer output."""
        norm = self.input_layernorm
        x, residual = add_rms_norm(x, residual, norm.weight, norm.eps)
        x = self.self_attn(x, cos, sin, batch, cache, plan)
        norm = self.post_attention_layernorm
        x, residual = add_rms_norm(x, residual, norm.weight, norm.eps)
        return self.mlp(x), residual


# %% chapters/13_fast_engine.md § The fast model
class FastQwen3Model(Qwen3PagedModel):
    """Chapter 9's model with fused glue kernels and fused projections, same outputs.

    Prefill uses ``paged_prefill_attention`` when ``use_paged_prefill`` is true and the
    cache qualifies (``reads_pool_directly``), chapter 9's ``prefill_attention`` else.
    """

    use_paged_prefill: bool = True

    @classmethod
    def from_paged(cls, model: Qwen3PagedModel) -> FastQwen3Model:
        """The fast twin of ``model``; every tensor not fused is shared with it."""
        with torch.device("meta"):  # the layers are replaced below: build nothing real
            fast = cls(model.config)
        fast.embed_tokens, fast.norm = model.embed_tokens, model.norm
        fast.lm_head = model.lm_head
        fast.layers = nn.ModuleList(FastQwen3Layer(layer) for layer in model.layers)
        fast.inv_freq = model.inv_freq
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
        if (not batch.is_decode and self.use_paged_prefill
                and batch.block_tables is not None
                and reads_pool_directly(cache, x.dtype)):
            plan = PrefillPlan.for_batch(batch, prefill_tiles(x.device)[0])
        for layer in self.layers:
            x, residual = layer(x, residual, cos, sin, batch, cache, plan)
        rows = batch.logits_indices
        x, _ = add_rms_norm(x[rows], residual[rows], self.norm.weight, self.norm.eps)
        return self.lm_head(x)


# %% chapters/13_fast_engine.md § Sampling in one kernel
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


# %% chapters/13_fast_engine.md § Sampling in one kernel
POSITION_BITS = 20  # a key's low bits: the tokens a sequence has generated so far


def fused_sampling_applies(params: list, vocab: int) -> bool:
    """Whether ``sample_fused`` can serve these rows: no top-k, no top-p."""
    return all(p.greedy or ((p.top_k <= 0 or p.top_k >= vocab) and p.top_p >= 1.0)
               for p in params)


def sampling_inputs(seqs: list, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: 1 / temperature (0 when greedy) and the Philox key, on ``device``."""
    keys = torch.randint(0, 2**62, (len(seqs),), dtype=torch.int64).tolist()
    inv_temperature = []
    for row, seq in enumerate(seqs):  # Python lists: a tensor per element costs more
        p = seq.params
        inv_temperature.append(0.0 if p.greedy else 1.0 / p.temperature)
        if p.seed is not None:
            seed = (p.seed + seq.sample_index) % 2 ** (62 - POSITION_BITS)
            position = len(seq.output_token_ids) % 2**POSITION_BITS
            keys[row] = (seed << POSITION_BITS) | position
    return (to_device(torch.tensor(inv_temperature, dtype=torch.float32), device),
            to_device(torch.tensor(keys, dtype=torch.int64), device))


def to_device(host: torch.Tensor, device) -> torch.Tensor:
    """``host`` on ``device``, queued behind the GPU's work instead of waiting for it:
    a GPU copies from pinned (page-locked) memory without stopping the host."""
    if torch.device(device).type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


# %% chapters/13_fast_engine.md § The fast engine
def as_fast_model(model: Qwen3PagedModel) -> FastQwen3Model:
    """The engine's model part: chapter 9's paged model made fast (weights shared)."""
    return model if isinstance(model, FastQwen3Model) else FastQwen3Model.from_paged(model)


class FusedSampler(Sampler):
    """Chapter 11's sampling part with one kernel for the rows that need neither top-k
    nor top-p; those that do go through chapter 11's ``sample``. Each row is routed on
    its own, so a seeded row draws the same tokens whatever shares its batch."""

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        vocab, device = logits.shape[1], logits.device
        if all(s.params.greedy for s in seqs):
            return super().__call__(logits, seqs)
        fused = [fused_sampling_applies([s.params], vocab) for s in seqs]
        if all(fused):
            return sample_fused(logits, *sampling_inputs(seqs, device))
        if not any(fused):
            return super().__call__(logits, seqs)
        fast = [row for row, f in enumerate(fused) if f]
        slow = [row for row, f in enumerate(fused) if not f]
        fast_rows, slow_rows = (to_device(torch.tensor(r), device) for r in (fast, slow))
        tokens = torch.empty(len(seqs), dtype=torch.int32, device=device)
        tokens[fast_rows] = sample_fused(logits[fast_rows], *sampling_inputs(
            [seqs[row] for row in fast], device))
        tokens[slow_rows] = super().__call__(logits[slow_rows],
                                             [seqs[row] for row in slow]).to(torch.int32)
        return tokens


# %% chapters/13_fast_engine.md § Chunked prefill, in the decode batch
def serves_mixed_batches(model: FastQwen3Model, cache: PagedKVCache) -> bool:
    """Whether one forward may take a step's prefills and decodes together: when the
    paged prefill kernel serves the prefills (a decode is a prefill of one token)."""
    return model.use_paged_prefill and reads_pool_directly(cache,
                                                           model.embed_tokens.weight.dtype)


# %% chapters/13_fast_engine.md § Host work off the critical path
UNRESOLVED = -1
"""The token a committed step holds until the token sampled on the GPU reaches the host."""


class OverlapScheduler(Scheduler):
    """Chapter 10's scheduler, able to commit a decode step before its tokens are known."""

    def next_is_decode(self) -> bool:
        """Whether the next ``schedule`` is sure to decode one token of every running
        sequence and do nothing else: no admission, swap-in or preemption."""
        running, config = self.running, self.config
        if (not running or self.swapped or len(running) > config.max_num_batched_tokens
                or (self.waiting and len(running) < config.max_num_seqs)
                or self._free_after(0) < len(running)):  # at most a new block each
            return False
        return all(s.output_token_ids  # Sequence.num_uncomputed_tokens == 1, written out
                   and len(s.prompt_token_ids) + len(s.output_token_ids)
                   - s.num_computed_tokens == 1 for s in running)

    def commit_unresolved(self, out: SchedulerOutput, stopped: dict) -> list[Sequence]:
        """Commit a decode step whose tokens are still on the GPU: each sequence gets
        ``UNRESOLVED``, except those in ``stopped`` (seq_id -> status), which finish.
        Returns the sequences that finished, ``max_tokens`` reached included."""
        self.manager.end_step(out.reservation)  # its tokens are told once resolved
        out.reservation = None
        now, done, limit = time.perf_counter(), [], self._length_limit
        for chunk in out.chunks:
            seq = chunk.seq
            status = stopped.get(seq.seq_id)
            if status is None:
                outputs = seq.output_token_ids
                seq.num_computed_tokens = chunk.start + 1
                outputs.append(UNRESOLVED)
                if (len(outputs) >= seq.params.max_tokens
                        or len(seq.prompt_token_ids) + len(outputs) >= limit):
                    status = SequenceStatus.FINISHED_LENGTH
            if status is not None:
                self._finish(seq, status, now)
                done.append(seq)
        if done:
            finished = set(done)
            self.running[:] = [s for s in self.running if s not in finished]
        return done

    # %% chapters/13_fast_engine.md § Host work off the critical path
    def resolve(self, seqs: list[Sequence], tokens: list[int], eos_token_id: int | None,
                keep_running: bool) -> tuple[dict, list[Sequence]]:
        """Put ``tokens`` in place of the placeholders that ``seqs`` end with.

        Returns ``(stopped, done)``: the running sequences a token stopped (seq_id ->
        status; left running if ``keep_running``, as they are in a launched step), and the
        sequences that are finished now and hold no placeholder any more.
        """
        now, stopped, done, told = time.perf_counter(), {}, [], {}
        for seq, token in zip(seqs, tokens):
            seq.output_token_ids[-1] = token
            if seq.status.finished:  # at max_tokens: complete now
                seq.status, seq.finish_time = self._stop_reason(seq, token, eos_token_id), now
                done.append(seq)
                continue
            told[seq.seq_id] = token
            if token == eos_token_id or seq.params.stop_token_ids:  # else it cannot stop
                status = self._stop_reason(seq, token, eos_token_id)
                if status is not None:
                    stopped[seq.seq_id] = status
        if told:  # before any of them is freed
            self.manager.end_step(None, sampled=told)
        if stopped and not keep_running:
            for seq in seqs:
                if seq.seq_id in stopped:
                    self._finish(seq, stopped[seq.seq_id], now)
                    done.append(seq)
            self.running[:] = [s for s in self.running if s.seq_id not in stopped]
            stopped = {}
        return stopped, done


# %% chapters/13_fast_engine.md § Host work off the critical path
@dataclass
class InFlightStep:
    """A decode step launched and committed before the host read its tokens."""

    rows: dict            # seq_id -> row of ``tokens``
    tokens: torch.Tensor  # [rows] on the device: the next step's input ids
    host: torch.Tensor    # [rows] their copy on the host (pinned on a GPU)
    ready: object         # the CUDA event of that copy (None on a CPU)
    placeholders: list = None  # (sequence, row) of every UNRESOLVED token


# %% chapters/13_fast_engine.md § Host work off the critical path
class OverlapStepLoop(StepLoop):
    """Chapter 11's step loop, with each plain decode step launched before the
    previous step's tokens reach the host, and committed before its own do. Needs
    the ``OverlapScheduler``."""

    def __init__(self, engine) -> None:
        super().__init__(engine)
        self.overlapped_steps = 0
        self.launched: InFlightStep | None = None

    def in_flight(self) -> bool:
        return self.launched is not None or bool(self.ready)

    def settle(self) -> None:
        """Read the tokens in flight, if any: the engine is synchronous again."""
        self._resolve(keep_running=False)

    # %% chapters/13_fast_engine.md § Host work off the critical path
    def step(self) -> list:
        """Chapter 11's step; a plain decode step is launched before the previous step's
        tokens are read, and committed before its own are."""
        engine = self.engine
        if not engine.scheduler.next_is_decode() or any(  # log-probabilities: synchronous
                s.params.logprobs is not None for s in engine.scheduler.running):
            self.settle()
            finished, self.ready = self.ready + super().step(), []
            return finished
        t0 = time.perf_counter()
        out = engine.scheduler.schedule()
        t1 = time.perf_counter()
        launched = self._launch(out)
        stopped = self._resolve(keep_running=True)  # step t's tokens, while t+1 runs
        t2 = time.perf_counter()
        done = engine.scheduler.commit_unresolved(out, stopped)
        self._finished([s for s in done if s.seq_id in stopped])  # the others hold a placeholder
        launched.placeholders = [(c.seq, row) for row, c in enumerate(out.chunks)
                                 if c.seq.seq_id not in stopped]
        self.launched = launched
        self.overlapped_steps += 1
        engine.account(out, len(launched.placeholders), t1 - t0 + time.perf_counter() - t2,
                       t2 - t1)
        finished, self.ready = self.ready, []
        return finished

    def _launch(self, out: SchedulerOutput) -> InFlightStep:
        """Queue a decode step's forward and sampling; its tokens start for the host."""
        runner, previous = self.engine.runner, self.launched
        seqs = [c.seq for c in out.chunks]
        try:
            runner.move_blocks(out)
            if previous is None:
                logits = runner.forward(out)[0]
            else:  # the input ids are the previous step's tokens, still on the GPU
                rows = torch.tensor([previous.rows[c.seq.seq_id] for c in out.chunks])
                logits = runner.decode(out, previous.tokens[to_device(rows,
                                                                      previous.tokens.device)])
            tokens = runner.sampler(logits, seqs)
        except BaseException:
            self.engine.scheduler.abort_step(out)
            raise
        host, ready = tokens, None
        if tokens.is_cuda:
            host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            host.copy_(tokens, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()
        return InFlightStep({s.seq_id: i for i, s in enumerate(seqs)}, tokens, host, ready)

    # %% chapters/13_fast_engine.md § Host work off the critical path
    def _resolve(self, keep_running: bool) -> dict:
        """Wait for the in-flight step's tokens and put them in place. Returns the
        sequences they stopped that are also in a launched step (see ``resolve``)."""
        step, self.launched = self.launched, None
        if step is None:
            return {}
        if step.ready is not None:
            step.ready.synchronize()
        tokens = step.host.tolist()
        seqs = [seq for seq, _ in step.placeholders]
        stopped, done = self.engine.scheduler.resolve(
            seqs, [tokens[row] for _, row in step.placeholders], self.engine.eos_token_id,
            keep_running)
        if not keep_running:
            done += self.stop_on_text(seqs)
        for seq in self.engine.output_processor.text_stops(seqs):  # in a launched step
            if seq.status.finished:
                seq.status = SequenceStatus.FINISHED_STOPPED
            else:
                stopped[seq.seq_id] = SequenceStatus.FINISHED_STOPPED
        self._finished(done)
        return stopped

    def _finished(self, done: list[Sequence]) -> None:
        """Account finished sequences that hold their true tokens; queue the output of each
        request that is finished and holds no placeholder any more."""
        self.ready += self.engine.finish(done, complete=lambda request: not any(
            s.output_token_ids and s.output_token_ids[-1] == UNRESOLVED for s in request.seqs))
