"""Chapter 8 reference solutions."""

import math

import torch
import triton
import triton.language as tl

from minipaged.kernels.kv_cache import PagedKVCache


def kv_crossover_predictions() -> dict[str, float]:
    per_token = 2 * 28 * 8 * 128 * 2          # K and V, 28 layers, 8 KV heads, D 128, bf16
    tokens = 1.2e9 / per_token                # about 10,500
    return {"tokens": tokens, "batch of 64 x 1,000": 64 * 1000 / tokens,
            "4 KV heads": 2.0, "fp8 cache": 2.0, "32 query heads": 1.0}


def window_tile_starts(length: int, window: int, tile: int) -> list[int]:
    lo = max(0, length - window)
    return list(range(lo - lo % tile, length, tile))


@triton.jit
def _window_kernel(q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, first_ptr, count_ptr, out_ptr,
                   scale_log2, group, window, stride_qb, stride_qh, stride_ob, stride_oh,
                   stride_table,
                   stride_block, stride_token, stride_head,
                   GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
                   BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1).to(tl.int64)
    length = tl.load(lens_ptr + b)
    lo = tl.maximum(length - window, 0)                 # first position in the window
    rows = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, DIM_PAD)
    dim_ok = dims < HEAD_DIM
    heads = kv_head * group + rows
    io_mask = (rows < group)[:, None] & dim_ok[None, :]
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + dims[None, :],
                mask=io_mask, other=0.0)
    table_row = tables_ptr + b * stride_table
    head_base = kv_head * stride_head
    tokens = tl.arange(0, TILE)
    m = tl.full([GROUP_PAD], -float("inf"), dtype=tl.float32)
    l = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM_PAD], dtype=tl.float32)
    first = tl.load(first_ptr + b)                      # the plan's tiles, made on the host
    for i in range(0, tl.load(count_ptr + b)):
        tile_start = first + i * TILE                   # aligned: a tile stays in a block
        positions = tile_start + tokens
        valid = (positions >= lo) & (positions < length)
        if BLOCK_SIZE % TILE == 0:
            block = tl.load(table_row + tile_start // BLOCK_SIZE).to(tl.int64)
            token_offsets = block * stride_block + (tile_start % BLOCK_SIZE + tokens) * stride_token
        else:
            block = tl.load(table_row + positions // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
            token_offsets = block * stride_block + (positions % BLOCK_SIZE) * stride_token
        offsets = token_offsets[:, None] + head_base + dims[None, :]
        kv_mask = valid[:, None] & dim_ok[None, :]
        k = tl.load(k_ptr + offsets, mask=kv_mask, other=0.0)
        scores = tl.dot(q, tl.trans(k)) * scale_log2
        scores = tl.where(valid[None, :], scores, -float("inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + offsets, mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    result = acc / tl.where(l > 0, l, 1.0)[:, None]
    tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + dims[None, :],
             result.to(out_ptr.dtype.element_ty), mask=io_mask)


def sliding_window_attention(query: torch.Tensor, cache: PagedKVCache, layer: int,
                             block_tables: torch.Tensor, seq_lens: torch.Tensor, window: int,
                             scale: float | None = None) -> torch.Tensor:
    batch, num_heads, head_dim = query.shape
    group = num_heads // cache.num_kv_heads
    out = torch.empty_like(query)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    stride_block, stride_token, stride_head = cache.strides()
    tile = 16 if query.device.type != "cuda" else 64
    plans = [window_tile_starts(n, window, tile) for n in seq_lens.tolist()]
    first = torch.tensor([p[0] if p else 0 for p in plans], dtype=torch.int32)
    count = torch.tensor([len(p) for p in plans], dtype=torch.int32)
    _window_kernel[(batch, cache.num_kv_heads)](
        query, cache.key_cache(layer), cache.value_cache(layer), block_tables, seq_lens,
        first.to(query.device), count.to(query.device), out,
        scale * 1.4426950408889634, group, window, query.stride(0), query.stride(1),
        out.stride(0), out.stride(1), block_tables.stride(0), stride_block, stride_token,
        stride_head, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        DIM_PAD=triton.next_power_of_2(head_dim), BLOCK_SIZE=cache.block_size,
        TILE=tile)
    return out
