"""How fast a decode kernel could read a paged KV cache at all: loads alone, per layout.

    python benchmarks/archive/experiment_kv_gather_floor.py --out DIR

Writes DIR/kv_gather_floor_h200.json: {"device", "date", "command", "versions",
"copy_bandwidth_bytes_per_s", "rows": [...]}.

A kernel that walks the block tables exactly as the decode kernels do (one program per
(sequence, KV head), tiles of 128 tokens, shuffled blocks of 16) but only loads K and V and sums
the words, so nothing is computed. Its time is the floor of the gather itself: what the memory
system gives for rows of this size at this stride. Three layouts of the same tokens:

- ``bf16 NHD``: chapter 7's layout in bf16, a (token, head) row of 256 bytes, rows of one head
  1 KB apart (chapter 8's kernel reads this);
- ``fp8 NHD``: the same layout in e4m3, rows of 128 bytes (chapter 13's cache);
- ``fp8 HND``: heads outside tokens within a block, so a block's 16 rows of one head are 2 KB in
  one piece.

Each row records the median µs and the share of the measured copy bandwidth.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import minipaged.runtime  # noqa: E402,F401  (before triton: the interpreter switch on CPU)
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from benchmarks.archive.gpu_record import gpu_main  # noqa: E402

BLOCK_SIZE, KV_HEADS, HEAD_DIM, TILE = 16, 8, 128, 128
LAYOUTS = {"bf16 NHD": (2, "NHD"), "fp8 NHD": (1, "NHD"), "fp8 HND": (1, "HND")}


@triton.jit
def _gather_kernel(k_ptr, v_ptr, tables_ptr, out_ptr, length, stride_table, stride_block,
                   stride_token, stride_head, WORDS: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                   TILE: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    words = tl.arange(0, WORDS)
    acc = tl.zeros([TILE, WORDS], dtype=tl.int32)
    for start in range(0, length, TILE):
        positions = start + tl.arange(0, TILE)
        valid = positions < length
        block = tl.load(tables_ptr + b * stride_table + positions // BLOCK_SIZE, mask=valid,
                        other=0).to(tl.int64)
        rows = block * stride_block + (positions % BLOCK_SIZE) * stride_token + head * stride_head
        offsets = rows[:, None] + words[None, :]
        acc += tl.load(k_ptr + offsets, mask=valid[:, None], other=0)
        acc += tl.load(v_ptr + offsets, mask=valid[:, None], other=0)
    tl.store(out_ptr + b * tl.num_programs(1) + head, tl.sum(tl.sum(acc, axis=1), axis=0))


def make_case(batch: int, length: int, elem: int, layout: str, device: str, seed: int = 0):
    """K and V planes as int32 words, shuffled block tables, and the strides in words."""
    gen = torch.Generator(device=device).manual_seed(seed)
    blocks_per_seq = -(-length // BLOCK_SIZE)
    num_blocks = batch * blocks_per_seq
    words = HEAD_DIM * elem // 4
    shape = ((num_blocks, BLOCK_SIZE, KV_HEADS, words) if layout == "NHD"
             else (num_blocks, KV_HEADS, BLOCK_SIZE, words))
    k, v = (torch.randint(-8, 8, shape, dtype=torch.int32, device=device, generator=gen)
            for _ in range(2))
    strides = ((k.stride(0), k.stride(1), k.stride(2)) if layout == "NHD"
               else (k.stride(0), k.stride(2), k.stride(1)))
    perm = torch.randperm(num_blocks, device=device, generator=gen)
    tables = perm.view(batch, blocks_per_seq).to(torch.int32)
    return k, v, tables, strides, words


def gather_sum(k, v, tables, strides, words, length: int) -> torch.Tensor:
    batch = tables.shape[0]
    out = torch.empty(batch, KV_HEADS, dtype=torch.int32, device=k.device)
    _gather_kernel[(batch, KV_HEADS)](k, v, tables, out, length, tables.stride(0), *strides,
                                      WORDS=words, BLOCK_SIZE=BLOCK_SIZE, TILE=TILE,
                                      num_warps=4, num_stages=3)
    return out


def reference_sum(k, v, tables, layout: str, length: int) -> torch.Tensor:
    """The same sums in torch: every token's K and V words, per (sequence, head)."""
    sums = []
    for row in tables.long():
        kk, vv = k[row], v[row]                        # [blocks, ...] of this sequence
        if layout == "HND":
            kk, vv = kk.transpose(1, 2), vv.transpose(1, 2)
        kk = kk.reshape(-1, KV_HEADS, kk.shape[-1])[:length]
        vv = vv.reshape(-1, KV_HEADS, vv.shape[-1])[:length]
        sums.append((kk.sum(dim=(0, 2)) + vv.sum(dim=(0, 2))).to(torch.int32))
    return torch.stack(sums)


def timings(log=print) -> list[dict]:
    from benchmarks.bench_decode_attention import COPY_TBPS, SIZES, bench

    rows = []
    for batch, length in [*SIZES[::2], (128, 2048)]:   # shapes with no split needed
        for name, (elem, layout) in LAYOUTS.items():
            k, v, tables, strides, words = make_case(batch, length, elem, layout, "cuda")
            us = bench(lambda: gather_sum(k, v, tables, strides, words, length))
            nbytes = 2 * batch * length * KV_HEADS * HEAD_DIM * elem
            rows.append({"batch": batch, "seq_len": length, "layout": name, "us": us,
                         "bytes": nbytes,
                         "copy_fraction": nbytes / (us * 1e-6) / (COPY_TBPS * 1e12)})
            log(f"B={batch:4d} L={length:6d} {name}: {us:7.1f} us  "
                f"{rows[-1]['copy_fraction']:.0%} of copy")
            del k, v, tables
            torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    return gpu_main(argv, __doc__, "kv_gather_floor_h200.json", lambda: {"rows": timings()},
                    needs_fp8=False)


if __name__ == "__main__":
    sys.exit(main())
