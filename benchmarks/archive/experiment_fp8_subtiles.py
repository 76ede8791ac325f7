"""A candidate design for chapter 13's fp8 decode kernel: tl.dot's 16 rows filled, not padded.

    python benchmarks/archive/experiment_fp8_subtiles.py --out DIR

Writes DIR/fp8_subtiles_h200.json: {"device", "date", "command", "versions",
"copy_bandwidth_bytes_per_s", "rows": [...]}.

Why: ``tl.dot`` needs at least 16 rows, so chapter 13's kernel pads a GQA group of 4 query heads to
16 and every score, exponential and reduction of the online softmax runs on 12 rows of padding. In
the fp8 cache a token costs half the bytes of bf16, and that fixed work per token no longer hides
under the loads. Here the 16 rows are (token sub-tile, head) pairs: with a group of ``G`` (padded
to ``GP``) the tile's tokens are cut into ``J = 16 / GP`` sub-tiles, the query is laid out
block-diagonally (row ``j * GP + h`` holds head ``h``'s query in columns ``j*D .. (j+1)*D``) and K
is loaded as ``[TILE / J, J * D]``, so one ``tl.dot`` gives every row the scores of its own
sub-tile: ``[16, TILE / J]`` scores in place of ``[16, TILE]``. Each row keeps its own online
softmax; the probabilities go back to the tile's token order, block-diagonally, for ``p @ V``, and
the ``J`` states of each head are merged at the end as split-KV merges ranges. The scales, V in
pairs of bytes, and the split-KV partial results are chapter 13's.

For each of chapter 8's shapes (and 16 query heads, a group of 2, at 64 x 4,096) it times chapter
8's bf16 kernel, chapter 13's fp8 kernel and this one at three launch configurations, with the
relative distance of this kernel's output from chapter 13's (the same values are read: rounding
only). It also times chapter 13's own kernel under a register cap (``maxnreg``), which lets more
programs share an SM: with 256-token tiles the kernel takes 255 registers a thread and about 80 KB
of shared memory, so an SM holds two programs, eight warps, too few to hide the latency of each
tile's chain of loads, products and reductions.

The sub-tile kernel has run on the CPU interpreter (tests/test_benchmarks.py checks it against
attention over the dequantized cache); none of this has yet been timed on a GPU.
"""

from __future__ import annotations

import contextlib
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import minipaged.runtime  # noqa: E402,F401  (before triton: the interpreter switch on CPU)
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from minipaged.memory.block_table import ceil_div  # noqa: E402
from minipaged.kernels.decode_attention import (merge_splits_kernel, split_ranges,  # noqa: E402
                                                choose_num_splits)
import minipaged.kernels.fp8_kv_cache as fp8_module  # noqa: E402
from minipaged.kernels.fp8_kv_cache import _e4m3_pairs  # noqa: E402
from benchmarks.archive.gpu_record import gpu_main, shipped_case, time_candidate  # noqa: E402


@triton.jit
def _subtile_kernel(q_ptr, k_ptr, v_pairs_ptr, ks_ptr, vs_ptr, tables_ptr, lens_ptr, out_ptr,
                    part_out_ptr, part_ml_ptr, scale_log2, min_split, num_splits, group,
                    stride_qb, stride_qh, stride_ob, stride_oh, stride_table,
                    stride_block, stride_token, stride_head, stride_sblock, stride_shead,
                    GP: tl.constexpr, J: tl.constexpr, D: tl.constexpr,
                    BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, SPLIT: tl.constexpr,
                    INTERP: tl.constexpr, DOT: tl.constexpr):
    ROWS: tl.constexpr = GP * J
    T4: tl.constexpr = TILE // J
    b = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    length = tl.load(lens_ptr + b)
    per_split = tl.maximum(tl.cdiv(tl.cdiv(length, num_splits), TILE) * TILE, min_split)
    start = split * per_split
    end = tl.minimum(length, start + per_split)
    r = tl.arange(0, ROWS)
    sub = r // GP                       # token sub-tile of row r
    h = r % GP                          # head of row r within the group
    h_ok = h < group
    cols = tl.arange(0, J * D)
    dims = tl.arange(0, D)
    qmask = h_ok[:, None] & ((cols // D)[None, :] == sub[:, None])
    q = tl.load(q_ptr + b * stride_qb + (kv_head * group + h)[:, None] * stride_qh
                + (cols % D)[None, :], mask=qmask, other=0.0).to(tl.float32)
    q_top = tl.max(tl.abs(q), axis=1)
    q_top = tl.where(q_top > 0, q_top, 1.0)
    q = (q / q_top[:, None]).to(DOT)
    q_scale = q_top * scale_log2
    t = tl.arange(0, T4)
    js = tl.arange(0, J)
    tokens = tl.arange(0, TILE)
    halves = tl.arange(0, D // 2)
    head_base = kv_head * stride_head
    shead = kv_head * stride_shead
    m = tl.full([ROWS], -float("inf"), dtype=tl.float32)
    l = tl.zeros([ROWS], dtype=tl.float32)
    even = tl.zeros([ROWS, D // 2], dtype=tl.float32)
    odd = tl.zeros([ROWS, D // 2], dtype=tl.float32)
    table_row = tables_ptr + b * stride_table
    for tile_start in range(start, end, TILE):
        # K as [T4, J*D]: element (t, j*D + d) is token tile_start + j*T4 + t, dim d
        pos2 = tile_start + js[None, :] * T4 + t[:, None]                 # [T4, J]
        ok2 = pos2 < end
        blk2 = tl.load(table_row + pos2 // BLOCK_SIZE, mask=ok2, other=0).to(tl.int64)
        row2 = blk2 * stride_block + (pos2 % BLOCK_SIZE) * stride_token + head_base
        koffs = tl.reshape(row2[:, :, None] + dims[None, None, :], [T4, J * D])
        kok = tl.reshape(tl.broadcast_to(ok2[:, :, None], [T4, J, D]), [T4, J * D])
        k = tl.load(k_ptr + koffs, mask=kok, other=0.0)
        scores = tl.dot(q, tl.trans(k.to(DOT)))                           # [ROWS, T4]
        pos_rt = tile_start + sub[:, None] * T4 + t[None, :]
        ok_rt = pos_rt < end
        blk_rt = tl.load(table_row + pos_rt // BLOCK_SIZE, mask=ok_rt, other=0).to(tl.int64)
        ks = tl.load(ks_ptr + blk_rt * stride_sblock + shead + pos_rt % BLOCK_SIZE,
                     mask=ok_rt, other=0.0)
        scores = tl.where(ok_rt, scores * q_scale[:, None] * ks, -float("inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_safe)
        p = tl.exp2(scores - m_safe[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        # V in natural order: token tile_start + c, c = j*T4 + t
        positions = tile_start + tokens
        valid = positions < end
        block = tl.load(table_row + positions // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
        in_block = positions % BLOCK_SIZE
        rows = block * stride_block + in_block * stride_token + head_base
        pairs = tl.load(v_pairs_ptr + rows[:, None] // 2 + halves[None, :], mask=valid[:, None],
                        other=0)
        v_even, v_odd = _e4m3_pairs(pairs, INTERP)
        vs = tl.load(vs_ptr + block * stride_sblock + shead + in_block, mask=valid, other=0.0)
        v_top = tl.max(vs, axis=0)
        v_top = tl.where(v_top > 0, v_top, 1.0)
        wide = tl.reshape(tl.broadcast_to(p[:, None, :], [ROWS, J, T4]), [ROWS, TILE])
        mine = (tokens // T4)[None, :] == sub[:, None]
        pv = (tl.where(mine, wide, 0.0) * (vs / v_top)[None, :]).to(DOT)
        even = even * alpha[:, None] + v_top * tl.dot(pv, v_even.to(DOT))
        odd = odd * alpha[:, None] + v_top * tl.dot(pv, v_odd.to(DOT))
        m = m_new
    # merge the J sub-tile states of each head
    m2 = tl.reshape(m, [J, GP])
    big = tl.max(m2, axis=0)
    big_safe = tl.where(big == -float("inf"), 0.0, big)
    w = tl.exp2(m2 - big_safe[None, :])                                   # [J, GP]
    lh = tl.sum(tl.reshape(l, [J, GP]) * w, axis=0)
    eh = tl.sum(tl.reshape(even, [J, GP, D // 2]) * w[:, :, None], axis=0)
    oh = tl.sum(tl.reshape(odd, [J, GP, D // 2]) * w[:, :, None], axis=0)
    norm = tl.where(lh > 0, lh, 1.0)[:, None]
    hh = tl.arange(0, GP)
    heads = kv_head * group + hh
    mask = (hh < group)[:, None]
    if not SPLIT:
        dst = out_ptr + b * stride_ob + heads[:, None] * stride_oh + 2 * halves[None, :]
        tl.store(dst, (eh / norm).to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(dst + 1, (oh / norm).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        part = (b * group * tl.num_programs(1) + heads) * num_splits + split
        dst = part_out_ptr + part[:, None] * D + 2 * halves[None, :]
        tl.store(dst, eh / norm, mask=mask)
        tl.store(dst + 1, oh / norm, mask=mask)
        tl.store(part_ml_ptr + 2 * part, big, mask=hh < group)
        tl.store(part_ml_ptr + 2 * part + 1, lh, mask=hh < group)


def subtile_attention(cache, query, tables, lens, tile: int, warps: int, stages: int,
                      splits: int | None = None) -> torch.Tensor:
    """Decode attention over an ``Fp8PagedKVCache`` (layer 0) with the sub-tile kernel; the
    split-KV factor chosen as chapter 13 chooses it unless ``splits`` is given."""
    batch, num_heads, head_dim = query.shape
    if head_dim & (head_dim - 1) or head_dim < 2:
        raise ValueError(f"head_dim must be a power of 2, got {head_dim}")
    group = num_heads // cache.num_kv_heads
    gp = triton.next_power_of_2(group)
    j = max(1, 16 // gp)
    if tile % j:
        raise ValueError(f"a tile of {tile} tokens does not cut into {j} sub-tiles")
    out = torch.empty_like(query)
    max_tokens = tables.shape[1] * cache.block_size
    chosen = splits is None
    if chosen:
        splits = choose_num_splits(batch, cache.num_kv_heads, max_tokens, query.device)
    min_split = ceil_div(256, tile) * tile if chosen else tile
    _, splits = split_ranges(max_tokens, splits, tile, min_split)
    part_out = part_ml = out
    if splits > 1:
        parts = (batch, num_heads, splits)
        part_out = torch.empty(*parts, head_dim, dtype=torch.float32, device=query.device)
        part_ml = torch.empty(*parts, 2, dtype=torch.float32, device=query.device)
    cuda = query.device.type == "cuda"
    _subtile_kernel[(batch, cache.num_kv_heads, splits)](
        query, cache.key_cache(0), cache.value_cache(0).view(torch.int16), cache.scales[0, 0],
        cache.scales[0, 1], tables, lens, out, part_out, part_ml,
        head_dim ** -0.5 * math.log2(math.e), min_split, splits, group,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1), tables.stride(0),
        *cache.strides(), *cache.scale_strides(),
        GP=gp, J=j, D=head_dim, BLOCK_SIZE=cache.block_size, TILE=tile, SPLIT=splits > 1,
        INTERP=not cuda, DOT=tl.float16 if cuda else tl.float32,
        num_warps=warps, num_stages=stages)
    if splits > 1:
        merge_splits_kernel[(batch, num_heads)](part_out, part_ml, out, out.stride(0),
                                                 out.stride(1), splits,
                                                 SPLITS_PAD=triton.next_power_of_2(splits),
                                                 HEAD_DIM=head_dim, DIM_PAD=head_dim)
    return out


@contextlib.contextmanager
def chapter12_launch(tile: int, warps: int, stages: int, maxnreg: int | None,
                     programs_per_sm: int = 2):
    """Chapter 13's own kernel with another launch: tile, warps and stages, a register cap
    (``maxnreg``: fewer registers a thread, more programs an SM) and the programs an SM the
    split-KV factor aims at, patched in for the duration."""
    config = fp8_module._fp8_launch_config
    launch = fp8_module.Fp8Launch(tile, warps, stages, tl.float16, maxnreg, programs_per_sm)
    fp8_module._fp8_launch_config = lambda *args: launch
    try:
        yield
    finally:
        fp8_module._fp8_launch_config = config


# (tile, warps, stages, maxnreg) for chapter 13's own kernel. Triton's pipeliner keeps one
# buffer of K/V per tile below 5 stages here (the addresses come from a block-table load, a
# second level of loads), so the next tile's copy is issued only after this tile's products;
# from 5 stages on it keeps two, and the copy of tile i + 1 overlaps the work on tile i.
CHAPTER12_LAUNCHES = ((128, 4, 3, 128), (128, 4, 3, 96), (256, 4, 5, None),
                      (128, 4, 5, None), (128, 4, 5, 168), (64, 4, 5, None),
                      (128, 8, 5, None), (64, 4, 7, None))


def variants(fp8, query, tables, lens) -> dict:
    """Name -> a call: the sub-tile kernel at three launches; chapter 13's at other launches
    (a register cap, a deeper pipeline)."""
    calls = {f"subtiles tile {t} warps {w} stages {s}":
             (lambda t=t, w=w, s=s: subtile_attention(fp8, query, tables, lens, t, w, s))
             for t, w, s in ((256, 4, 3), (128, 4, 3), (256, 8, 3))}
    for t, w, s, cap in CHAPTER12_LAUNCHES:
        def launched(t=t, w=w, s=s, cap=cap):
            with chapter12_launch(t, w, s, cap):
                return fp8.paged_attention(query, 0, tables, lens)
        calls[f"chapter 13 tile {t} warps {w} stages {s} maxnreg {cap}"] = launched
    return calls


def timings(log=print) -> list[dict]:
    from benchmarks.bench_decode_attention import SIZES

    rows = []
    for batch, length in SIZES:
        for q_heads in ((32, 16) if (batch, length) == (64, 4096) else (32,)):
            with shipped_case(batch, length, q_heads, log) as case:
                calls = variants(case.fp8, case.query, case.tables, case.lens)
                for name, call in calls.items():
                    row = {"batch": batch, "seq_len": length, "q_heads": q_heads,
                           "kv_heads": 8, "head_dim": 128, "variant": name,
                           "bf16_us": case.bf16_us, "chapter12_us": case.shipped_us}
                    rows.append(time_candidate(row, call, case, log))
    return rows


def main(argv=None) -> int:
    return gpu_main(argv, __doc__, "fp8_subtiles_h200.json", lambda: {"rows": timings()})


if __name__ == "__main__":
    sys.exit(main())
