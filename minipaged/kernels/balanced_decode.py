# GENERATED from chapters/90_performance_notes.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/90_performance_notes.md § Decode work split by tokens
"""Decode attention with the work split by tokens: a plan for chapter 8's launcher."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from minipaged.runtime import tl, triton  # Triton, or its stand-in (chapter 0)

from minipaged.kernels.decode_attention import (PagedAttentionError, attend_group,
                                                check_decode_inputs, decode_launch_config,
                                                device_sm_count, launch_decode)
from minipaged.kernels.kv_cache import PagedKVCache
from minipaged.memory.sizing import ceil_div

__all__ = ["DecodeWork", "work_chunk", "plan_decode_work", "balanced_paged_attention"]


# %% chapters/90_performance_notes.md § Decode work split by tokens
@dataclass(frozen=True)
class DecodeWork:
    """A decode batch cut into work items of at most ``chunk`` tokens, a ``DecodePlan``.

    ``items [W, 4]`` int32 holds (sequence, start, end, direct) per item; a sequence
    cut into one item is ``direct`` (its program writes the output, no merge).
    ``first_item [B + 1]`` int32: sequence ``b``'s items are
    ``first_item[b]:first_item[b + 1]``. ``config`` is the kernel's (tile, warps,
    stages); ``block_size`` and ``num_kv_heads`` the cache's it was planned for.
    """

    items: torch.Tensor
    first_item: torch.Tensor
    chunk: int
    any_split: bool
    config: tuple[int, int, int]
    block_size: int
    num_kv_heads: int

    @property
    def grid(self) -> tuple[int, int]:
        return self.items.shape[0], self.num_kv_heads

    @property
    def partials(self) -> int:
        """One partial result per item when a sequence is cut; none otherwise."""
        return self.items.shape[0] if self.any_split else 0

    def kernel_args(self, seq_lens: torch.Tensor) -> dict:
        return dict(items_ptr=self.items)

    def merge(self, part_out: torch.Tensor, part_ml: torch.Tensor,
              out: torch.Tensor) -> None:
        _merge_items_kernel[(out.shape[0], out.shape[1])](
            self.first_item, part_out, part_ml, out, out.stride(0), out.stride(1),
            ITEMS=16, HEAD_DIM=out.shape[2], DIM_PAD=part_out.shape[-1])


def work_chunk(total_tokens: int, num_kv_heads: int, num_sms: int, granule: int,
               programs_per_sm: int = 4, min_chunk: int = 128) -> int:
    """Tokens per item: the batch's tokens over ``programs_per_sm`` programs per SM
    (each item runs one program per KV head), in whole granules, at least
    ``min_chunk``."""
    items = max(1, programs_per_sm * num_sms // num_kv_heads)
    chunk = ceil_div(ceil_div(max(total_tokens, 1), items), granule) * granule
    return max(chunk, ceil_div(min_chunk, granule) * granule)


# %% chapters/90_performance_notes.md § Decode work split by tokens
def plan_decode_work(seq_lens, cache: PagedKVCache, device=None,
                     programs_per_sm: int = 4, min_chunk: int = 128,
                     num_sms: int | None = None) -> DecodeWork:
    """Cut each sequence of ``seq_lens`` (host integers) into chunks of equal tokens.

    The chunk spreads the batch's tokens over about ``programs_per_sm`` programs per
    SM (``num_sms``, default: the device's); a length 0 gets one empty item, so its
    output is zeros.
    """
    lens = np.asarray(seq_lens, dtype=np.int64).reshape(-1)
    if lens.size and lens.min() < 0:
        raise PagedAttentionError(f"seq_lens must be >= 0, got {int(lens.min())}")
    device = cache.storage.device if device is None else torch.device(device)
    split_config = decode_launch_config(cache.head_dim, device, split=True)
    granule = max(split_config[0], cache.block_size)
    chunk = work_chunk(int(lens.sum()), cache.num_kv_heads, num_sms or device_sm_count(device),
                       granule, programs_per_sm, min_chunk)
    counts = np.maximum(1, -(-lens // chunk))
    first = np.zeros(lens.size + 1, dtype=np.int64)
    np.cumsum(counts, out=first[1:])
    seq = np.repeat(np.arange(lens.size), counts)
    start = (np.arange(first[-1]) - first[seq]) * chunk
    end = np.minimum(start + chunk, lens[seq])
    items = np.stack([seq, start, end, counts[seq] == 1], axis=1)
    packed = torch.from_numpy(np.concatenate([items.ravel(), first]).astype(np.int32))
    packed = packed.to(device)                      # one host-to-device copy
    any_split = bool(counts.max(initial=1) > 1)
    config = split_config if any_split else decode_launch_config(cache.head_dim, device, False)
    return DecodeWork(packed[:items.size].view(-1, 4), packed[items.size:], chunk,
                      any_split, config, cache.block_size, cache.num_kv_heads)


# %% chapters/90_performance_notes.md § Decode work split by tokens
@triton.jit
def _balanced_decode_kernel(
        q_ptr, k_ptr, v_ptr, tables_ptr, items_ptr, out_ptr, part_out_ptr, part_ml_ptr,
        scale_log2, group, stride_qb, stride_qh, stride_ob, stride_oh, stride_table,
        stride_block, stride_token, stride_head,
        GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
        BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, FP32_PRECISION: tl.constexpr):
    item = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1).to(tl.int64)
    b = tl.load(items_ptr + 4 * item).to(tl.int64)
    start = tl.load(items_ptr + 4 * item + 1)
    end = tl.load(items_ptr + 4 * item + 2)
    direct = tl.load(items_ptr + 4 * item + 3)
    heads, row_ok, m, l, result = attend_group(        # an empty item: zeros
        q_ptr, k_ptr, v_ptr, tables_ptr + b * stride_table, b, kv_head, group, start, end,
        scale_log2, stride_qb, stride_qh, stride_block, stride_token, stride_head,
        GROUP_PAD, HEAD_DIM, DIM_PAD, BLOCK_SIZE, TILE, FP32_PRECISION)
    dims = tl.arange(0, DIM_PAD)
    out_mask = row_ok[:, None] & (dims < HEAD_DIM)[None, :]
    if direct != 0:
        tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + dims[None, :],
                 result.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:                                               # item slot [W, Hq]
        part = item * group * tl.num_programs(1) + heads
        tl.store(part_out_ptr + part[:, None] * DIM_PAD + dims[None, :], result,
                 mask=out_mask)
        tl.store(part_ml_ptr + 2 * part, m, mask=row_ok)
        tl.store(part_ml_ptr + 2 * part + 1, l, mask=row_ok)


# %% chapters/90_performance_notes.md § Decode work split by tokens
@triton.jit
def _merge_items_kernel(first_ptr, part_out_ptr, part_ml_ptr, out_ptr, stride_ob,
                        stride_oh, ITEMS: tl.constexpr, HEAD_DIM: tl.constexpr,
                        DIM_PAD: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    first = tl.load(first_ptr + b)
    last = tl.load(first_ptr + b + 1)
    if last - first > 1:
        dims = tl.arange(0, DIM_PAD)
        m_run = -float("inf")
        l_run = 0.0
        acc = tl.zeros([DIM_PAD], dtype=tl.float32)
        for group_start in range(first, last, ITEMS):
            items = group_start + tl.arange(0, ITEMS)
            ok = items < last
            part = items.to(tl.int64) * tl.num_programs(1) + h
            m = tl.load(part_ml_ptr + 2 * part, mask=ok, other=-float("inf"))
            l = tl.load(part_ml_ptr + 2 * part + 1, mask=ok, other=0.0)
            partial = tl.load(part_out_ptr + part[:, None] * DIM_PAD + dims[None, :],
                              mask=ok[:, None] & (dims[None, :] < HEAD_DIM), other=0.0)
            m_new = tl.maximum(m_run, tl.max(m, axis=0))   # finite: items are not empty
            alpha = tl.exp2(m_run - m_new)
            weight = tl.where(ok, tl.exp2(m - m_new) * l, 0.0)
            acc = acc * alpha + tl.sum(weight[:, None] * partial, axis=0)
            l_run = l_run * alpha + tl.sum(weight, axis=0)
            m_run = m_new
        tl.store(out_ptr + b * stride_ob + h * stride_oh + dims,
                 (acc / l_run).to(out_ptr.dtype.element_ty), mask=dims < HEAD_DIM)


# %% chapters/90_performance_notes.md § Decode work split by tokens
def balanced_paged_attention(query: torch.Tensor, cache: PagedKVCache, layer: int,
                             block_tables: torch.Tensor, seq_lens: torch.Tensor,
                             work: DecodeWork, scale: float | None = None,
                             out: torch.Tensor | None = None) -> torch.Tensor:
    """Chapter 8's ``paged_attention`` with the work split by tokens: ``work`` is
    ``plan_decode_work`` of the same lengths (on the host) and cache."""
    check_decode_inputs(query, cache, layer, block_tables, seq_lens)
    planned = (work.first_item.numel() - 1, work.block_size, work.num_kv_heads)
    if planned != (query.shape[0], cache.block_size, cache.num_kv_heads):
        raise PagedAttentionError(
            f"the work plan is for {planned[0]} sequences at block size {planned[1]} "
            f"with {planned[2]} KV heads, the batch has {query.shape[0]} at "
            f"{cache.block_size} with {cache.num_kv_heads}")
    return launch_decode(_balanced_decode_kernel, query, cache, block_tables, seq_lens,
                         work, scale=scale, out=out, k_ptr=cache.key_cache(layer),
                         v_ptr=cache.value_cache(layer))
