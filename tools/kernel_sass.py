"""What a decode kernel compiles to on an H200 (sm90), on a machine without a GPU.

    python tools/kernel_sass.py [bf16 | fp8 | fp8-subtiles | fp8-table-ahead
                                 | fp8-registers-ahead] [--tile N]
                                [--warps N] [--stages N] [--maxnreg N]

Compiles one specialization at the course's decode shape (32 query / 8 KV heads, head dim 128,
block size 16, bf16 queries, no split; integer strides divisible by 16, as the JIT sees them) and
prints, as JSON: registers a thread, stack bytes (spills), shared memory, how many programs an SM
holds and what limits it, and the instructions of the longest loop (one tile of the walk over
the cache) with their most frequent opcodes. A
memory-bound kernel wants few instructions a tile and enough programs an SM; this shows both
without spending GPU time. The build is Triton's own for sm90 (no GPU is needed: ptxas and
cuobjdump come with Triton); timings still need the card.

- ``bf16``: chapter 8's ``_paged_decode_kernel`` (default tile 64, as its launcher picks);
- ``fp8``: chapter 13's ``_fp8_decode_kernel`` (default: its launcher's tile of 128 tokens and
  cap of 128 registers a thread);
- ``fp8-subtiles``: the candidate of ``benchmarks/archive/experiment_fp8_subtiles.py``;
- ``fp8-table-ahead``, ``fp8-registers-ahead``: the candidates of
  ``benchmarks/archive/experiment_fp8_table_ahead.py`` (the table read a tile ahead; the next tile's K/V
  too, into registers).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"            # compile for real, even on a CPU-only machine
ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks" / "archive")]

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

STRIDES_16 = {"stride_qb", "stride_qh", "stride_ob", "stride_oh", "stride_table", "stride_block",
              "stride_token", "stride_head", "stride_sblock", "stride_shead", "min_split"}
POINTERS = {"q_ptr": "*bf16", "out_ptr": "*bf16", "tables_ptr": "*i32", "lens_ptr": "*i32",
            "part_out_ptr": "*fp32", "part_ml_ptr": "*fp32", "ks_ptr": "*fp32", "vs_ptr": "*fp32"}


def source(kernel, pointers: dict, constants: dict) -> ASTSource:
    signature = {n: "constexpr" if n in constants else pointers.get(n) or POINTERS.get(n)
                 or ("fp32" if n == "scale_log2" else "i32") for n in kernel.arg_names}
    aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kernel.arg_names)
               if signature[n].startswith("*") or n in STRIDES_16}
    return ASTSource(fn=kernel, signature=signature, attrs=aligned,
                     constexprs={(kernel.arg_names.index(n),): v for n, v in constants.items()})


def kernel_source(name: str, tile: int) -> ASTSource:
    if name == "bf16":
        from minipaged.kernels.decode_attention import _paged_decode_kernel
        return source(_paged_decode_kernel, {"k_ptr": "*bf16", "v_ptr": "*bf16"},
                      dict(GROUP_PAD=16, HEAD_DIM=128, DIM_PAD=128, BLOCK_SIZE=16, TILE=tile,
                           GRANULE=tile, SPLIT=False, FP32_PRECISION=None))
    fp8_pointers = {"k_ptr": "*fp8e4nv", "v_pairs_ptr": "*i16"}
    if name == "fp8":
        from minipaged.kernels.fp8_kv_cache import _fp8_decode_kernel
        return source(_fp8_decode_kernel, fp8_pointers,
                      dict(GROUP_PAD=16, HEAD_DIM=128, DIM_PAD=128, BLOCK_SIZE=16, TILE=tile,
                           SPLIT=False, DOT_DTYPE=tl.float16, FP32_PRECISION=None,
                           INTERPRETED=False))
    if name == "fp8-subtiles":
        from experiment_fp8_subtiles import _subtile_kernel
        return source(_subtile_kernel, fp8_pointers,
                      dict(GP=4, J=4, D=128, BLOCK_SIZE=16, TILE=tile, SPLIT=False,
                           INTERP=False, DOT=tl.float16))
    if name in ("fp8-table-ahead", "fp8-registers-ahead"):
        from experiment_fp8_table_ahead import table_ahead_kernel
        return source(table_ahead_kernel(name.split("-")[1]), fp8_pointers,
                      dict(GROUP_PAD=16, HEAD_DIM=128, DIM_PAD=128, BLOCK_SIZE=16, TILE=tile,
                           SPLIT=False, DOT_DTYPE=tl.float16, FP32_PRECISION=None,
                           INTERPRETED=False))
    raise SystemExit(f"unknown kernel {name!r}: bf16, fp8, fp8-subtiles, fp8-table-ahead "
                     "or fp8-registers-ahead")


def programs_per_sm(registers: int, warps: int, shared: int) -> dict:
    """How many programs an H100/H200 SM can hold, and what limits it: 64K registers
    (allocated 256 at a time per warp), 228 KB of shared memory (1 KB reserved a program),
    64 warps."""
    per_warp = -(-registers * 32 // 256) * 256
    limits = {"registers": 65536 // (per_warp * warps),
              "shared_memory": 233472 // (shared + 1024), "warps": 64 // warps}
    least = min(limits.values())
    return {"programs": least, "limited_by": [k for k, v in limits.items() if v == least]}


def longest_loop(sass: str) -> dict:
    """The longest backward branch's body: its instruction count, top opcodes, and the
    loads and stores of spilled registers (LDL, STL) in it."""
    code = [(int(a, 16), text) for a, text in
            re.findall(r"/\*([0-9a-f]+)\*/\s+([A-Z@][^;]*);", sass)]
    best = []
    for address, text in code:
        jump = re.search(r"BRA\s+(0x[0-9a-f]+)", text)
        if jump and int(jump.group(1), 16) < address:
            body = [t for a, t in code if int(jump.group(1), 16) <= a <= address]
            best = max(best, body, key=len)
    opcodes = collections.Counter(t.split()[1 if t.startswith("@") else 0].split(".")[0]
                                  for t in best)
    return {"instructions": len(best), "top_opcodes": dict(opcodes.most_common(10)),
            "spill_loads": opcodes["LDL"], "spill_stores": opcodes["STL"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernel", nargs="?", default="fp8")
    parser.add_argument("--tile", type=int, default=None)
    parser.add_argument("--warps", type=int, default=4)
    parser.add_argument("--stages", type=int, default=3)
    parser.add_argument("--maxnreg", type=int, default=None)
    args = parser.parse_args(argv)
    tile = args.tile or {"bf16": 64, "fp8": 128, "fp8-table-ahead": 128}.get(args.kernel, 256)
    maxnreg = args.maxnreg if args.maxnreg is not None else (
        128 if args.kernel in ("fp8", "fp8-table-ahead") and args.tile is None else None)
    options = {"num_warps": args.warps, "num_stages": args.stages}
    if maxnreg:                         # --maxnreg 0: no cap
        options["maxnreg"] = maxnreg
    print(json.dumps(report(args.kernel, tile, options)))
    return 0


def report(kernel: str, tile: int, options: dict) -> dict:
    """Registers, stack, shared memory, programs an SM and the tile loop of one build."""
    compiled = triton.compile(kernel_source(kernel, tile),
                              target=GPUTarget("cuda", 90, 32), options=options)
    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.TemporaryDirectory() as folder:
        cubin = Path(folder) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        run = lambda *flags: subprocess.run([str(tools / "cuobjdump"), *flags, str(cubin)],  # noqa: E731
                                            capture_output=True, text=True, check=True).stdout
        usage, sass = run("-res-usage"), run("-sass")
    registers = int(re.search(r"REG:(\d+)", usage).group(1))
    return {"kernel": kernel, "tile": tile, **options, "target": "sm90",
            "registers": registers,
            "stack_bytes": int(re.search(r"STACK:(\d+)", usage).group(1)),
            "shared_bytes": compiled.metadata.shared,
            "programs_per_sm": programs_per_sm(registers, options["num_warps"],
                                               compiled.metadata.shared),
            "loop": longest_loop(sass)}


if __name__ == "__main__":
    sys.exit(main())
