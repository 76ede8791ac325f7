"""Chapter 13's fp8 decode kernel at launches that fit more programs on an SM, on a GPU with FP8.

    python benchmarks/archive/sweep_fp8_occupancy.py --out DIR

Writes DIR/fp8_occupancy_h200.json: {"device", "date", "command", "versions",
"copy_bandwidth_bytes_per_s", "rows": [...], "builds": [...]}.

An SM runs a program's next tile only after the copy of its K/V has landed: Triton's pipeliner
keeps one buffer per tile here, because the addresses come from a block-table load. What hides
the wait is other programs on the same SM. Their number is set by registers and shared memory,
and by the split-KV factor when the batch alone gives too few programs. Each launch here is
(tokens per tile, warps, stages, a register cap or none, the programs an SM the split-KV factor
aims at). The rows are timed against chapter 8's bf16 kernel at chapter 8's shapes and four
more, each with its relative distance from the shipped launch's output (rounding only: the same
values are read). ``builds`` holds each launch's sm90 build as ``tools/kernel_sass.py`` reads it:
registers, spills, shared memory and the programs an SM holds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import minipaged.runtime  # noqa: E402,F401  (before triton: the interpreter switch on CPU)

from benchmarks.bench_decode_attention import COPY_TBPS, SIZES, bench  # noqa: E402
from benchmarks.bench_fp8 import paired_caches  # noqa: E402
from benchmarks.archive.experiment_fp8_subtiles import chapter12_launch  # noqa: E402
from minipaged.kernels.decode_attention import paged_attention  # noqa: E402
from minipaged.kernels.fp8_kv_cache import fp8_bytes_per_token  # noqa: E402
from benchmarks.archive.gpu_record import gpu_main  # noqa: E402

# (tile, warps, stages, register cap, programs an SM the split aims at)
LAUNCHES = ((256, 4, 3, None, 2), (128, 4, 3, None, 2), (128, 4, 3, 128, 2),
            (128, 4, 3, 128, 4), (128, 4, 3, 96, 5), (64, 4, 3, 96, 5), (128, 4, 5, 168, 3))
SHAPES = [*SIZES, (32, 8192), (4, 65536), (128, 2048)]


def timings(log=print) -> list[dict]:
    rows = []
    for batch, length in SHAPES:
        cache, fp8, query, tables, lens = paired_caches(batch, length, 32, 8, 128, 16, "cuda")
        shipped = fp8.paged_attention(query, 0, tables, lens).float()
        bf16_us = bench(lambda: paged_attention(query, cache, 0, tables, lens))
        fp8_bytes = batch * length * fp8_bytes_per_token(1, 8, 128)
        for tile, warps, stages, cap, per_sm in LAUNCHES:
            row = {"batch": batch, "seq_len": length, "tile": tile, "warps": warps,
                   "stages": stages, "max_registers": cap, "programs_per_sm": per_sm,
                   "bf16_us": bf16_us}
            try:
                with chapter12_launch(tile, warps, stages, cap, per_sm):
                    run = lambda: fp8.paged_attention(query, 0, tables, lens)  # noqa: E731
                    out = run().float()
                    row["fp8_us"] = bench(run)
            except Exception as error:  # recorded: out of shared memory, for one
                row["error"] = f"{type(error).__name__}: {str(error)[:200]}"
                log(json.dumps(row))
                rows.append(row)
                continue
            row.update({"speedup": bf16_us / row["fp8_us"],
                        "fp8_copy_fraction": fp8_bytes / (row["fp8_us"] * 1e-6)
                        / (COPY_TBPS * 1e12),
                        "rel_distance_from_shipped": ((out - shipped).norm()
                                                      / shipped.norm()).item()})
            rows.append(row)
            log(f"B={batch:4d} L={length:6d} tile {tile:3d} warps {warps} stages {stages} "
                f"cap {cap} aim {per_sm}: {row['fp8_us']:6.1f} us  x{row['speedup']:.2f}  "
                f"{row['fp8_copy_fraction']:.0%} of copy")
        del cache, fp8, query, tables, lens
        torch.cuda.empty_cache()
    return rows


def builds(log=print) -> list[dict]:
    """Each launch's sm90 build (``tools/kernel_sass.py``): registers a thread, spills, shared
    memory, and the programs an SM holds under them."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    import kernel_sass

    rows = []
    for tile, warps, stages, cap, _ in dict.fromkeys(launch[:4] + (0,) for launch in LAUNCHES):
        options = {"num_warps": warps, "num_stages": stages, **({"maxnreg": cap} if cap else {})}
        try:
            build = kernel_sass.report("fp8", tile, options)
        except Exception as error:  # recorded, the timings still stand
            build = {"error": f"{type(error).__name__}: {str(error)[:200]}"}
        rows.append({"tile": tile, "warps": warps, "stages": stages, "max_registers": cap,
                     **{k: build.get(k) for k in ("registers", "stack_bytes", "shared_bytes",
                                                  "programs_per_sm", "loop", "error")
                        if k in build}})
        log(json.dumps(rows[-1]))
    return rows


def main(argv=None) -> int:
    return gpu_main(argv, __doc__, "fp8_occupancy_h200.json",
                    lambda: {"rows": timings(), "builds": builds()})


if __name__ == "__main__":
    sys.exit(main())
