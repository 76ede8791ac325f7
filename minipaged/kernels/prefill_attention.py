# GENERATED from chapters/15_prefill_and_overlap.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/15_prefill_and_overlap.md § A paged prefill kernel
"""Prefill attention over the paged cache in one kernel: ``paged_prefill_attention``.

Every key a prefill query may see, cached prefix and new tokens alike, is read from the
block pool through its sequence's block table (``cache.write`` has stored the new ones),
so a ragged batch of prompts, cached prefixes, chunks of a chunked prefill and one-token
decode rows takes one launch per layer. ``plan_paged_prefill`` is the prefill part that
chapter 14's fast model takes (``FastQwen3Model.plan_prefill``). A ``batch`` argument is
chapter 9's ``ForwardBatch``, read by its fields only: a kernel imports no model.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from minipaged.kernels.fp8_kv_cache import Fp8PagedKVCache
from minipaged.kernels.kv_cache import PagedKVCache
from minipaged.runtime import tl, triton  # Triton, or its stand-in (chapter 0)

__all__ = ["PrefillPlan", "prefill_tiles", "reads_pool_directly", "paged_prefill_attention",
           "plan_paged_prefill", "serves_mixed_batches"]


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

    # %% chapters/15_prefill_and_overlap.md § The kernel as the model's prefill part
    def attend(self, query: torch.Tensor, cache: PagedKVCache, layer: int,
               batch: ForwardBatch, scale: float) -> torch.Tensor:
        """One layer's prefill attention of ``query [N, Hq, D]`` by the paged kernel."""
        return paged_prefill_attention(query, cache, layer, batch, scale, self)


# %% chapters/15_prefill_and_overlap.md § A paged prefill kernel
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
        if FP8:  # chapter 13's per-(slot, head) scales: on scores and probabilities
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


# %% chapters/15_prefill_and_overlap.md § A paged prefill kernel
def prefill_tiles(device: torch.device) -> tuple[int, int]:
    """(query tile, key tile) of the paged prefill kernel: 64 on a GPU, else 16."""
    return (64, 64) if device.type == "cuda" else (16, 16)


def reads_pool_directly(cache: PagedKVCache, dtype: torch.dtype) -> bool:
    """Whether ``paged_prefill_attention`` may read ``cache``'s storage: plain K/V in
    ``dtype``, or chapter 13's e4m3 blocks with their scales."""
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


# %% chapters/15_prefill_and_overlap.md § The kernel as the model's prefill part
def plan_paged_prefill(batch: ForwardBatch, cache: PagedKVCache,
                       dtype: torch.dtype) -> PrefillPlan | None:
    """The prefill part of chapter 14's fast model: a plan for ``paged_prefill_attention``,
    or None (chapter 9's ``prefill_attention``) when the batch has no block tables or the
    cache does not qualify (``reads_pool_directly``)."""
    if batch.block_tables is None or not reads_pool_directly(cache, dtype):
        return None
    return PrefillPlan.for_batch(batch, prefill_tiles(batch.input_ids.device)[0])


# %% chapters/15_prefill_and_overlap.md § Chunked prefill, in the decode batch
def serves_mixed_batches(model, cache: PagedKVCache) -> bool:
    """Whether one forward may take a step's prefills and decodes together: when the
    paged prefill kernel serves the model's prefills (a decode is a prefill of one token)."""
    return (getattr(model, "plan_prefill", None) is plan_paged_prefill
            and reads_pool_directly(cache, model.embed_tokens.weight.dtype))
