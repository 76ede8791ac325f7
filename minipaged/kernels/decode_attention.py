# GENERATED from chapters/08_paged_attention.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/08_paged_attention.md § The math, and the reference
"""Paged decode attention: one query token per sequence against its paged K/V."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from minipaged.runtime import tl, triton  # Triton, or its stand-in (chapter 0)

from minipaged.memory.block_table import blocks_needed
from minipaged.kernels.kv_cache import PagedKVCache
from minipaged.memory.sizing import ceil_div

__all__ = [
    "paged_attention",
    "paged_attention_reference",
    "paged_attention_torch",
    "TorchDecodePlan",
    "DECODE_ATTENTION",
    "PagedAttentionError",
    "choose_num_splits",
    # the launcher that the later decode kernels plug into (chapter 13, the appendix)
    "launch_decode",
    "DecodePlan",
    "SplitPlan",
    "split_plan",
    "check_decode_inputs",
    "check_block_tables",
    "decode_output",
    "attend_group",
    "merge_splits_kernel",
    "decode_launch_config",
    "fp32_precision",
    "device_sm_count",
    "split_ranges",
    "range_of_split",
]


# %% chapters/08_paged_attention.md § The math, and the reference
class PagedAttentionError(ValueError):
    """Arguments of paged_attention that do not fit each other or the cache."""


def paged_attention_reference(query: torch.Tensor, cache: PagedKVCache, layer: int,
                              block_tables: torch.Tensor, seq_lens: torch.Tensor,
                              scale: float | None = None) -> torch.Tensor:
    """Decode attention in fp32, one sequence at a time through ``cache.gather``."""
    batch, num_heads, head_dim = query.shape
    group = num_heads // cache.num_kv_heads
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    out = torch.zeros(batch, num_heads, head_dim, dtype=torch.float32,
                      device=query.device)
    for b in range(batch):
        length = int(seq_lens[b])
        if length == 0:
            continue
        table = block_tables[b, :blocks_needed(length, cache.block_size)]
        k, v = (x.float().repeat_interleave(group, dim=1)
                for x in cache.gather(layer, table, length))
        scores = torch.einsum("hd,thd->ht", query[b].float(), k) * scale
        out[b] = torch.einsum("ht,thd->hd", scores.softmax(dim=-1), v)
    return out


# %% chapters/08_paged_attention.md § Version 1: one program per sequence and KV head
@triton.jit
def _attend_tiles(q, k_ptr, v_ptr, table_row, head_base, start, end, scale_log2,
                  stride_block, stride_token,
                  GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                  DIM_PAD: tl.constexpr,
                  BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr,
                  FP32_PRECISION: tl.constexpr):
    """Online softmax of ``q [GROUP_PAD, DIM_PAD]`` over positions ``[start, end)``.

    Returns ``(m, l, acc)``: running max (base 2), denominator, unnormalised output.
    ``start`` must be a multiple of ``TILE`` (and of ``BLOCK_SIZE`` when that is larger
    than ``TILE``).
    """
    dims = tl.arange(0, DIM_PAD)
    dim_ok = dims < HEAD_DIM
    tokens = tl.arange(0, TILE)
    m = tl.full([GROUP_PAD], -float("inf"), dtype=tl.float32)
    l = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM_PAD], dtype=tl.float32)
    for tile_start in range(start, end, TILE):
        positions = tile_start + tokens
        valid = positions < end
        if BLOCK_SIZE % TILE == 0:  # the tile lies in one block: contiguous rows
            block = tl.load(table_row + tile_start // BLOCK_SIZE).to(tl.int64)
            token_offsets = (block * stride_block
                             + (tile_start % BLOCK_SIZE + tokens) * stride_token)
        else:                       # the tile spans several blocks: one entry per row
            block = tl.load(table_row + positions // BLOCK_SIZE, mask=valid, other=0)
            token_offsets = (block.to(tl.int64) * stride_block
                             + (positions % BLOCK_SIZE) * stride_token)
        offsets = token_offsets[:, None] + head_base + dims[None, :]
        kv_mask = valid[:, None] & dim_ok[None, :]
        k = tl.load(k_ptr + offsets, mask=kv_mask, other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=FP32_PRECISION) * scale_log2
        scores = tl.where(valid[None, :], scores, -float("inf"))     # [GROUP_PAD, TILE]
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + offsets, mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v,
                                            input_precision=FP32_PRECISION)
        m = m_new
    return m, l, acc


# %% chapters/08_paged_attention.md § Version 1: one program per sequence and KV head
@triton.jit
def attend_group(q_ptr, k_ptr, v_ptr, table_row, b, kv_head, group, start, end,
                 scale_log2, stride_qb, stride_qh, stride_block, stride_token,
                 stride_head, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                 DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr,
                 FP32_PRECISION: tl.constexpr):
    """The query rows of ``kv_head``'s group in sequence ``b`` over positions
    ``[start, end)``: ``(heads, row_ok, m, l, result)``, result = acc / l (0 if empty)."""
    rows = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, DIM_PAD)
    row_ok = rows < group
    heads = kv_head * group + rows
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + dims[None, :],
                mask=row_ok[:, None] & (dims < HEAD_DIM)[None, :], other=0.0)
    m, l, acc = _attend_tiles(q, k_ptr, v_ptr, table_row, kv_head * stride_head, start,
                              end, scale_log2, stride_block, stride_token, GROUP_PAD,
                              HEAD_DIM, DIM_PAD, BLOCK_SIZE, TILE, FP32_PRECISION)
    return heads, row_ok, m, l, acc / tl.where(l > 0, l, 1.0)[:, None]


# %% chapters/08_paged_attention.md § Version 1: one program per sequence and KV head
@triton.jit
def _decode_kernel_v1(q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, out_ptr, scale_log2,
                      group,
                      stride_qb, stride_qh, stride_ob, stride_oh, stride_table,
                      stride_block, stride_token, stride_head,
                      GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                      DIM_PAD: tl.constexpr,
                      BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr,
                      FP32_PRECISION: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1).to(tl.int64)
    length = tl.load(lens_ptr + b)
    heads, row_ok, m, l, result = attend_group(
        q_ptr, k_ptr, v_ptr, tables_ptr + b * stride_table, b, kv_head, group, 0, length,
        scale_log2, stride_qb, stride_qh, stride_block, stride_token, stride_head,
        GROUP_PAD, HEAD_DIM, DIM_PAD, BLOCK_SIZE, TILE, FP32_PRECISION)
    dims = tl.arange(0, DIM_PAD)
    tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + dims[None, :],
             result.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & (dims < HEAD_DIM)[None, :])


# %% chapters/08_paged_attention.md § Version 1: one program per sequence and KV head
def decode_launch_config(head_dim: int, device: torch.device,
                         split: bool) -> tuple[int, int, int]:
    """(tokens per tile, warps, pipeline stages) of the decode kernels; H200-tuned."""
    if device.type != "cuda":
        return 16, 4, 1         # interpreter: the smallest tile tl.dot accepts on GPUs
    if head_dim > 128:
        return 32, 4, 3
    return (128 if split else 64), 4, 3


def fp32_precision(dtype: torch.dtype) -> str | None:
    """``tl.dot``'s input_precision: exact fp32 products for fp32, else the default."""
    return "ieee" if dtype == torch.float32 else None


def _paged_attention_v1(query: torch.Tensor, cache: PagedKVCache, layer: int,
                        block_tables: torch.Tensor, seq_lens: torch.Tensor,
                        scale: float | None = None) -> torch.Tensor:
    """Version 1 (teaching): one program per (sequence, KV head), no split or checks."""
    batch, num_heads, head_dim = query.shape
    group = num_heads // cache.num_kv_heads
    out = torch.empty_like(query)
    tile, num_warps, num_stages = decode_launch_config(head_dim, query.device, split=False)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    stride_block, stride_token, stride_head = cache.strides()
    _decode_kernel_v1[(batch, cache.num_kv_heads)](
        query, cache.key_cache(layer), cache.value_cache(layer), block_tables, seq_lens,
        out,
        scale * 1.4426950408889634, group, query.stride(0), query.stride(1),
        out.stride(0), out.stride(1), block_tables.stride(0),
        stride_block, stride_token, stride_head,
        GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        DIM_PAD=triton.next_power_of_2(head_dim), BLOCK_SIZE=cache.block_size,
        TILE=tile,
        FP32_PRECISION=fp32_precision(query.dtype),
        num_warps=num_warps, num_stages=num_stages)
    return out


# %% chapters/08_paged_attention.md § Version 2: split-KV, when the batch is too small
@triton.jit
def range_of_split(lens_ptr, b, split, num_splits, min_split, GRANULE: tl.constexpr):
    """Positions ``[start, end)`` of split ``split`` of sequence ``b``: its length cut
    in ``num_splits`` ranges of whole granules, none shorter than ``min_split``."""
    length = tl.load(lens_ptr + b)
    per_split = tl.cdiv(tl.cdiv(length, num_splits), GRANULE) * GRANULE
    per_split = tl.maximum(per_split, min_split)
    start = split * per_split
    return start, tl.minimum(length, start + per_split)


@triton.jit
def _paged_decode_kernel(
        q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, out_ptr, part_out_ptr, part_ml_ptr,
        scale_log2, min_split, num_splits, group,
        stride_qb, stride_qh, stride_ob, stride_oh, stride_table,
        stride_block, stride_token, stride_head,
        GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
        BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, GRANULE: tl.constexpr,
        SPLIT: tl.constexpr, FP32_PRECISION: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    start, end = range_of_split(lens_ptr, b, split, num_splits, min_split, GRANULE)
    heads, row_ok, m, l, result = attend_group(   # a split with no token: 0, l = 0
        q_ptr, k_ptr, v_ptr, tables_ptr + b * stride_table, b, kv_head, group, start, end,
        scale_log2, stride_qb, stride_qh, stride_block, stride_token, stride_head,
        GROUP_PAD, HEAD_DIM, DIM_PAD, BLOCK_SIZE, TILE, FP32_PRECISION)
    dims = tl.arange(0, DIM_PAD)
    out_mask = row_ok[:, None] & (dims < HEAD_DIM)[None, :]
    if not SPLIT:
        tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + dims[None, :],
                 result.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:                                   # this split's partial result, merged below
        part = (b * group * tl.num_programs(1) + heads) * num_splits + split  # [B,Hq,S]
        tl.store(part_out_ptr + part[:, None] * DIM_PAD + dims[None, :], result,
                 mask=out_mask)
        tl.store(part_ml_ptr + 2 * part, m, mask=row_ok)
        tl.store(part_ml_ptr + 2 * part + 1, l, mask=row_ok)


# %% chapters/08_paged_attention.md § Version 2: split-KV, when the batch is too small
@triton.jit
def merge_splits_kernel(part_out_ptr, part_ml_ptr, out_ptr, stride_ob, stride_oh,
                        num_splits, SPLITS_PAD: tl.constexpr,
                        HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    splits = tl.arange(0, SPLITS_PAD)
    dims = tl.arange(0, DIM_PAD)
    split_ok = splits < num_splits
    part = (b * tl.num_programs(1) + h) * num_splits + splits
    m = tl.load(part_ml_ptr + 2 * part, mask=split_ok, other=-float("inf"))
    l = tl.load(part_ml_ptr + 2 * part + 1, mask=split_ok, other=0.0)
    m_max = tl.max(m, axis=0)
    m_max = tl.where(m_max == -float("inf"), 0.0, m_max)   # empty sequence: weights 0
    weight = tl.where(l > 0, tl.exp2(m - m_max) * l, 0.0)
    partial = tl.load(part_out_ptr + part[:, None] * DIM_PAD + dims[None, :],
                      mask=split_ok[:, None] & (dims[None, :] < HEAD_DIM), other=0.0)
    total = tl.sum(weight, axis=0)
    result = tl.sum(weight[:, None] * partial, axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + dims,
             result.to(out_ptr.dtype.element_ty), mask=dims < HEAD_DIM)


# %% chapters/08_paged_attention.md § Version 2: split-KV, when the batch is too small
_SM_COUNT: dict[int, int] = {}


def device_sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (cached); a small stand-in else."""
    if device.type != "cuda":
        return 4                # the interpreter: small, so CPU runs split too
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT[index]


def choose_num_splits(batch: int, num_kv_heads: int, max_tokens: int,
                      device: torch.device,
                      min_tokens_per_split: int = 256, programs_per_sm: int = 2) -> int:
    """Split-KV factor: about ``programs_per_sm`` programs per SM, each over at least
    ``min_tokens_per_split`` tokens."""
    wanted = programs_per_sm * device_sm_count(device) // max(1, batch * num_kv_heads)
    return max(1, min(wanted, max_tokens // min_tokens_per_split, 64))


def split_ranges(length: int, num_splits: int, granule: int,
                 min_split: int = 0) -> tuple[int, int]:
    """(tokens per split, splits) of one sequence, as the kernel cuts it: ranges of
    whole granules, at least ``min_split`` tokens, none empty."""
    tokens_per_split = ceil_div(max(length, 1), num_splits)
    tokens_per_split = max(ceil_div(tokens_per_split, granule) * granule, min_split)
    return tokens_per_split, max(1, ceil_div(length, tokens_per_split))


# %% chapters/08_paged_attention.md § Version 2: split-KV, when the batch is too small
class DecodePlan(Protocol):
    """How a decode launch spreads its work, as ``launch_decode`` reads it."""

    grid: tuple[int, ...]   # the programs: (sequences or work items, KV heads, ...)
    partials: int           # partial results per query head (0: programs write out)
    config: tuple           # the kernel's (tile, warps, stages, ...)

    def kernel_args(self, seq_lens: torch.Tensor) -> dict:
        """The plan's own arguments of the kernel, by parameter name."""

    def merge(self, part_out: torch.Tensor, part_ml: torch.Tensor,
              out: torch.Tensor) -> None:
        """Combine the partial results into ``out``."""


@dataclass(frozen=True)
class SplitPlan:
    """Split-KV, a ``DecodePlan``: each sequence cut by its own length into at most
    ``num_splits`` ranges of whole ``granule`` tokens, none shorter than ``min_split``;
    one program per (sequence, KV head, split)."""

    batch: int
    num_kv_heads: int
    num_splits: int
    min_split: int
    granule: int
    config: tuple

    @property
    def grid(self) -> tuple[int, int, int]:
        return self.batch, self.num_kv_heads, self.num_splits

    @property
    def partials(self) -> int:
        """One partial result per (sequence, split); none without a split."""
        return self.batch * self.num_splits if self.num_splits > 1 else 0

    def kernel_args(self, seq_lens: torch.Tensor) -> dict:
        return dict(lens_ptr=seq_lens, min_split=self.min_split,
                    num_splits=self.num_splits, GRANULE=self.granule,
                    SPLIT=self.num_splits > 1)

    def merge(self, part_out: torch.Tensor, part_ml: torch.Tensor,
              out: torch.Tensor) -> None:
        merge_splits_kernel[(out.shape[0], out.shape[1])](
            part_out, part_ml, out, out.stride(0), out.stride(1), self.num_splits,
            SPLITS_PAD=triton.next_power_of_2(self.num_splits), HEAD_DIM=out.shape[2],
            DIM_PAD=part_out.shape[-1])


# %% chapters/08_paged_attention.md § Version 2: split-KV, when the batch is too small
def split_plan(query: torch.Tensor, cache: PagedKVCache, block_tables: torch.Tensor,
               num_splits: int | None = None, min_split: int | None = None,
               configs: tuple[tuple, tuple] | None = None, programs_per_sm: int = 2,
               block_aligned: bool = True) -> SplitPlan:
    """The split of a decode launch over ``block_tables`` (their width bounds a length).

    ``num_splits`` None: chosen for about ``programs_per_sm`` programs per SM, and
    ``min_split`` 256 tokens; given: ``min_split`` defaults to one granule. ``configs``
    are the kernel's (tile, warps, stages, ...) without and with a split (default:
    ``decode_launch_config``'s). Ranges start at multiples of the tile, and with
    ``block_aligned`` of the block size too (the tile walk's contiguous path).
    """
    batch, max_tokens = query.shape[0], block_tables.shape[1] * cache.block_size
    if configs is None:
        configs = tuple(decode_launch_config(cache.head_dim, query.device, split)
                        for split in (False, True))
    chosen = num_splits is None
    if chosen:
        num_splits = choose_num_splits(batch, cache.num_kv_heads, max_tokens, query.device,
                                       programs_per_sm=programs_per_sm)
    config = configs[1] if num_splits > 1 else configs[0]
    granule = max(config[0], cache.block_size) if block_aligned else config[0]
    if min_split is None:
        min_split = 256 if chosen else granule
    min_split = ceil_div(max(min_split, 1), granule) * granule
    _, num_splits = split_ranges(max_tokens, num_splits, granule, min_split)
    return SplitPlan(batch, cache.num_kv_heads, num_splits, min_split, granule, config)


# %% chapters/08_paged_attention.md § Version 2: split-KV, when the batch is too small
def check_decode_inputs(query: torch.Tensor, cache: PagedKVCache, layer: int,
                        block_tables: torch.Tensor, seq_lens: torch.Tensor,
                        match_dtype: bool = True) -> None:
    """Raise ``PagedAttentionError`` (``KVCacheError`` for the layer) on misfits; with
    ``match_dtype`` the query must have the cache's dtype."""
    if query.dim() != 3:
        raise PagedAttentionError(f"query must be [batch, num_heads, head_dim], "
                                  f"got {list(query.shape)}")
    batch, num_heads, head_dim = query.shape
    if head_dim != cache.head_dim:
        raise PagedAttentionError(f"query must be [batch, num_heads, {cache.head_dim}] "
                                  f"(the cache's head_dim), got {list(query.shape)}")
    if num_heads % cache.num_kv_heads:
        raise PagedAttentionError(f"{num_heads} query heads are not a multiple of the "
                                  f"cache's {cache.num_kv_heads} KV heads")
    if match_dtype and query.dtype != cache.dtype:
        raise PagedAttentionError(f"query is {query.dtype} but the cache holds "
                                  f"{cache.dtype}")
    if (block_tables.dim() != 2 or block_tables.shape[0] != batch
            or block_tables.dtype != torch.int32):
        raise PagedAttentionError(f"block_tables must be int32 [batch={batch}, "
                                  f"max_blocks], got {block_tables.dtype} "
                                  f"{list(block_tables.shape)}")
    if seq_lens.shape != (batch,) or seq_lens.dtype != torch.int32:
        raise PagedAttentionError(f"seq_lens must be int32 [batch={batch}], got "
                                  f"{seq_lens.dtype} {list(seq_lens.shape)}")
    for name, tensor in (("query", query), ("block_tables", block_tables),
                         ("seq_lens", seq_lens)):
        if tensor.device != cache.storage.device:
            raise PagedAttentionError(f"{name} is on {tensor.device}, the cache on "
                                      f"{cache.storage.device}")
    cache.key_cache(layer)  # raises for a layer out of range


# %% chapters/08_paged_attention.md § Version 2: split-KV, when the batch is too small
def check_block_tables(cache: PagedKVCache, block_tables: torch.Tensor,
                       seq_lens: torch.Tensor) -> None:
    """Raise ``PagedAttentionError`` if a length does not fit its table row or a block
    it reads is outside the cache.

    Reads the values: free on the CPU, a synchronisation on a GPU.
    """
    width = block_tables.shape[1]
    if seq_lens.numel() and (int(seq_lens.min()) < 0
                             or int(seq_lens.max()) > width * cache.block_size):
        raise PagedAttentionError(
            f"seq_lens must lie in [0, {width * cache.block_size}] (block_tables width "
            f"{width}"
            f" x block size {cache.block_size}), got "
            f"[{int(seq_lens.min())}, {int(seq_lens.max())}]")
    read = (torch.arange(width, device=block_tables.device)[None, :]
            < ceil_div(seq_lens[:, None].long(), cache.block_size))
    bad = read & ((block_tables < 0) | (block_tables >= cache.num_blocks))
    if bad.any():
        b, j = (int(i) for i in bad.nonzero()[0])
        raise PagedAttentionError(f"block_tables[{b}, {j}] = {int(block_tables[b, j])} "
                                  f"is read "
                                  f"but the cache has blocks 0..{cache.num_blocks - 1}")


def decode_output(query: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """The tensor a decode kernel writes: ``out`` checked against ``query``, or a new one."""
    if out is None:
        return torch.empty_like(query)
    if (out.shape != query.shape or out.dtype != query.dtype
            or out.device != query.device):
        raise PagedAttentionError(f"out must be like query ({query.dtype} "
                                  f"{list(query.shape)} "
                                  f"on {query.device}), got {out.dtype} "
                                  f"{list(out.shape)} on "
                                  f"{out.device}")
    return out


# %% chapters/08_paged_attention.md § Version 2: split-KV, when the batch is too small
def launch_decode(kernel, query: torch.Tensor, cache: PagedKVCache,
                  block_tables: torch.Tensor, seq_lens: torch.Tensor, plan: DecodePlan, *,
                  scale: float | None = None, out: torch.Tensor | None = None,
                  check_tables: bool | None = None,
                  compute_dtype: torch.dtype | None = None, **kernel_args) -> torch.Tensor:
    """Run the decode ``kernel`` over ``plan``: the host side all decode kernels share.

    The caller has checked the arguments (``check_decode_inputs``) and planned from
    them. This checks the tables' values when ``check_tables`` (default: ``seq_lens`` on
    the CPU), makes or checks ``out``, gives the query (in ``compute_dtype``, if given)
    and the tables unit last strides, makes the partial buffers, launches ``kernel`` on
    ``plan.grid`` with the arguments every decode kernel takes, ``plan.kernel_args`` and
    ``kernel_args`` (all by name), and merges.
    """
    if check_tables if check_tables is not None else seq_lens.device.type == "cpu":
        check_block_tables(cache, block_tables, seq_lens)
    out = decode_output(query, out)
    batch, num_heads, head_dim = query.shape
    if batch == 0:
        return out
    if compute_dtype is not None:
        query = query.to(compute_dtype)
    query = query if query.stride(-1) == 1 else query.contiguous()
    if block_tables.stride(-1) != 1:
        block_tables = block_tables.contiguous()
    dim_pad = triton.next_power_of_2(head_dim)
    part_out = part_ml = out                # unused without partial results
    if plan.partials:
        rows = plan.partials * num_heads
        part_out = torch.empty(rows, dim_pad, dtype=torch.float32, device=query.device)
        part_ml = torch.empty(rows, 2, dtype=torch.float32, device=query.device)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    group = num_heads // cache.num_kv_heads
    tile, num_warps, num_stages = plan.config[:3]
    stride_block, stride_token, stride_head = cache.strides()
    kernel[plan.grid](
        q_ptr=query, tables_ptr=block_tables, out_ptr=out, part_out_ptr=part_out,
        part_ml_ptr=part_ml, scale_log2=scale * 1.4426950408889634, group=group,
        stride_qb=query.stride(0), stride_qh=query.stride(1), stride_ob=out.stride(0),
        stride_oh=out.stride(1), stride_table=block_tables.stride(0),
        stride_block=stride_block, stride_token=stride_token, stride_head=stride_head,
        GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        DIM_PAD=dim_pad, BLOCK_SIZE=cache.block_size, TILE=tile,
        FP32_PRECISION=fp32_precision(query.dtype), num_warps=num_warps,
        num_stages=num_stages, **plan.kernel_args(seq_lens), **kernel_args)
    if plan.partials:
        plan.merge(part_out, part_ml, out)
    return out


# %% chapters/08_paged_attention.md § Version 2: split-KV, when the batch is too small
def paged_attention(query: torch.Tensor, cache: PagedKVCache, layer: int,
                    block_tables: torch.Tensor, seq_lens: torch.Tensor,
                    scale: float | None = None, num_splits: int | None = None,
                    out: torch.Tensor | None = None,
                    check_tables: bool | None = None,
                    min_split: int | None = None) -> torch.Tensor:
    """Decode attention of ``query[B, Hq, D]`` over each sequence's paged K/V.

    Sequence ``b`` attends to its first ``seq_lens[b]`` tokens, found through
    ``block_tables[b, t // block_size]``; query head ``h`` reads KV head
    ``h // (Hq // Hkv)``; ``scale`` defaults to ``1/sqrt(D)``. Split-KV cuts each
    sequence's length into ``num_splits`` ranges (chosen when None), none shorter than
    ``min_split`` tokens (default: 256 when the split is chosen, one tile when it is
    given). Length 0 gives zeros; table entries past a
    sequence's length are never read. ``out``, if given, is like ``query`` and receives
    the result. With ``check_tables`` (default: when ``seq_lens`` is on the CPU) a
    length beyond its table row or a block outside the cache raises
    ``PagedAttentionError``.
    """
    check_decode_inputs(query, cache, layer, block_tables, seq_lens)
    plan = split_plan(query, cache, block_tables, num_splits, min_split)
    return launch_decode(_paged_decode_kernel, query, cache, block_tables, seq_lens, plan,
                         scale=scale, out=out, check_tables=check_tables,
                         k_ptr=cache.key_cache(layer), v_ptr=cache.value_cache(layer))


# %% chapters/08_paged_attention.md § The same operation in PyTorch, for a CPU
@dataclass(frozen=True)
class TorchDecodePlan:
    """What decode attention in PyTorch reads from a step's tables, worked out once: the
    block ids to gather, the longest length, and the mask (None when lengths are equal)."""

    blocks: torch.Tensor               # int32 [B * width]: each row's first `width` blocks
    longest: int
    visible: torch.Tensor | None       # [B, 1, 1, longest] bool, True where a key counts
    empty: torch.Tensor | None         # [B, 1, 1] bool, True for a sequence of length 0

    @classmethod
    def build(cls, block_size: int, block_tables: torch.Tensor, seq_lens: torch.Tensor
              ) -> TorchDecodePlan:
        batch = seq_lens.shape[0]
        shortest, longest = (int(n) for n in seq_lens.aminmax()) if batch else (0, 0)
        width = blocks_needed(longest, block_size)
        visible = empty = None  # equal lengths need no mask (nor a fix-up)
        if shortest < longest:
            positions = torch.arange(longest, device=seq_lens.device)
            visible = (positions < seq_lens[:, None])[:, None, None]
            empty = (seq_lens == 0)[:, None, None] if shortest == 0 else None
        return cls(block_tables[:, :width].reshape(-1), longest, visible, empty)

    def attend(self, query: torch.Tensor, cache: PagedKVCache, layer: int,
               scale: float | None = None) -> torch.Tensor:
        """Decode attention of ``query`` [B, H, D] over ``layer``'s cached tokens."""
        if self.longest == 0:
            return torch.zeros_like(query)
        batch, _, head_dim = query.shape
        shape = (batch, -1, cache.num_kv_heads, head_dim)
        k, v = (cache.token_view(x).index_select(0, self.blocks).view(shape)[:, :self.longest]
                .transpose(1, 2) for x in (cache.key_cache(layer), cache.value_cache(layer)))
        out = F.scaled_dot_product_attention(query[:, :, None], k, v, attn_mask=self.visible,
                                             scale=scale, enable_gqa=True)[:, :, 0]
        return out if self.empty is None else out.masked_fill(self.empty, 0.0)


def paged_attention_torch(query: torch.Tensor, cache: PagedKVCache, layer: int,
                          block_tables: torch.Tensor, seq_lens: torch.Tensor,
                          scale: float | None = None, **_) -> torch.Tensor:
    """``paged_attention`` in plain PyTorch: one gather through the block tables, one
    masked SDPA call; ``query``'s dtype and device. Kernel-only options are ignored."""
    check_decode_inputs(query, cache, layer, block_tables, seq_lens)
    plan = TorchDecodePlan.build(cache.block_size, block_tables, seq_lens)
    return plan.attend(query, cache, layer, scale)


DECODE_ATTENTION = {"triton": paged_attention, "torch": paged_attention_torch}
"""Decode attention by backend name (a cache's ``attention_backend``)."""
