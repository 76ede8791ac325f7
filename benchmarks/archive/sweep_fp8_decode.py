"""Launch configurations of chapter 13's fp8 decode kernel, side by side, on a GPU with FP8.

    python benchmarks/archive/sweep_fp8_decode.py --out DIR [--quick]

Writes DIR/fp8_decode_sweep_h200.json: {"device", "date", "command", "versions",
"copy_bandwidth_bytes_per_s", "rows": [...], "best": {...}}.

For each of chapter 8's shapes (B=64 L=4096, B=8 L=32768, B=256 L=1024; 32 query / 8 KV heads,
D 128, block size 16, shuffled blocks) it times chapter 8's bf16 kernel once, then the fp8 kernel
under every (``tl.dot`` input dtype, tokens per tile, warps, stages) of the grid, with the split-KV
factor chosen as the kernel chooses it. A row records the median µs, the share of the measured copy
bandwidth in fp8 bytes (scales included), the speed-up over bf16, and the output's relative distance
from the bf16 kernel's (the quantization error, about 3%: a wrong configuration shows as far more).
A configuration that does not compile (too much shared memory) is recorded with its error.
``best`` holds, per shape and per split/no split, the fastest configuration.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import minipaged.runtime  # noqa: E402,F401  (before triton: the interpreter switch on CPU)
import triton.language as tl  # noqa: E402

import minipaged.kernels.fp8_kv_cache as fp8_module  # noqa: E402
from benchmarks.bench_decode_attention import COPY_TBPS, SIZES, bench  # noqa: E402
from benchmarks.bench_fp8 import HEADS, paired_caches  # noqa: E402
from minipaged.kernels.decode_attention import paged_attention  # noqa: E402
from minipaged.kernels.fp8_kv_cache import Fp8Launch, fp8_bytes_per_token, fp8_supported  # noqa: E402

DOT_DTYPES = {"bf16": tl.bfloat16, "fp16": tl.float16}
TILES = (32, 64, 128, 256)
WARPS = (4, 8)
STAGES = (2, 3, 4)


def sweep(quick: bool, log=print) -> list[dict]:
    grid = list(itertools.product(DOT_DTYPES, TILES, WARPS, STAGES))
    sizes = SIZES
    if quick:
        grid, sizes = grid[:2], [(4, 512)]
    q_heads, kv_heads, head_dim = HEADS
    rows, original = [], fp8_module._fp8_launch_config
    try:
        for batch, length in sizes:
            cache, fp8, query, tables, lens = paired_caches(batch, length, q_heads, kv_heads,
                                                            head_dim, 16, "cuda")
            reference = paged_attention(query, cache, 0, tables, lens).float()
            bf16_us = bench(lambda: paged_attention(query, cache, 0, tables, lens), rep_ms=100)
            fp8_bytes = batch * length * fp8_bytes_per_token(1, kv_heads, head_dim)
            for dot, tile, warps, stages in grid:
                fp8_module._fp8_launch_config = (
                    lambda *_, c=Fp8Launch(tile, warps, stages, DOT_DTYPES[dot]): c)
                row = {"batch": batch, "seq_len": length, "dot": dot, "tile": tile,
                       "num_warps": warps, "num_stages": stages, "bf16_us": bf16_us}
                run = lambda: fp8.paged_attention(query, 0, tables, lens)  # noqa: E731
                try:
                    out = run().float()
                    us = bench(run, rep_ms=100)
                except Exception as error:  # recorded: out of shared memory, for one
                    row["error"] = f"{type(error).__name__}: {str(error)[:200]}"
                    rows.append(row)
                    log(json.dumps(row))
                    continue
                row.update({
                    "fp8_us": us, "speedup": bf16_us / us,
                    "fp8_copy_fraction": fp8_bytes / (us * 1e-6) / (COPY_TBPS * 1e12),
                    "rel_distance_from_bf16": ((out - reference).norm()
                                               / reference.norm()).item()})
                rows.append(row)
                log(f"B={batch:4d} L={length:6d} {dot} tile {tile:3d} warps {warps} "
                    f"stages {stages}: {us:7.1f} us  x{row['speedup']:.2f}  "
                    f"{row['fp8_copy_fraction']:.0%} of copy bw  "
                    f"dist {row['rel_distance_from_bf16']:.1e}")
            del cache, fp8, query, tables, lens
            torch.cuda.empty_cache()
    finally:
        fp8_module._fp8_launch_config = original
    return rows


def best_rows(rows: list[dict]) -> dict:
    """The fastest configuration per shape and per dot dtype."""
    best = {}
    for row in rows:
        if "error" in row or row["rel_distance_from_bf16"] > 0.1:
            continue
        key = f"B={row['batch']} L={row['seq_len']} {row['dot']}"
        if key not in best or row["fp8_us"] < best[key]["fp8_us"]:
            best[key] = row
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results", help="folder for the JSON")
    parser.add_argument("--quick", action="store_true", help="two configurations, one shape")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or not fp8_supported("cuda"):
        print("needs a GPU with FP8 (compute capability 8.9 or newer)")
        return 2
    rows = sweep(args.quick)
    result = {"device": torch.cuda.get_device_name(),
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "command": "python " + " ".join(sys.argv),
              "versions": {"torch": torch.__version__,
                           "triton": __import__("triton").__version__},
              "copy_bandwidth_bytes_per_s": COPY_TBPS * 1e12,
              "rows": rows, "best": best_rows(rows)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fp8_decode_sweep_h200.json").write_text(json.dumps(result, indent=1))
    for key, row in result["best"].items():
        print(f"best {key}: tile {row['tile']} warps {row['num_warps']} "
              f"stages {row['num_stages']}  {row['fp8_us']:.1f} us  x{row['speedup']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
