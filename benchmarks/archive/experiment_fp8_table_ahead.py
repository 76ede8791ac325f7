"""Two candidates for chapter 13's fp8 decode kernel: the block table read one tile ahead,
and the next tile's K/V too.

    python benchmarks/archive/experiment_fp8_table_ahead.py --out DIR

Writes DIR/fp8_table_ahead_h200.json: {"device", "date", "command", "versions",
"copy_bandwidth_bytes_per_s", "rows": [...]}; each row has the candidate's ``kind`` ("table" or
"registers") and launch.

Why: in chapter 13's loop a tile's K/V addresses come from a block-table load of the same
iteration. With that second level of loads Triton's pipeliner keeps one buffer per tile and issues
the next tile's copy only after this tile's products, so a program waits for every copy and only
other programs on the SM hide it.

- ``table``: the table entries of tile ``i + 1`` are loaded during tile ``i`` and carried into the
  next iteration, so the K/V addresses no longer depend on a load of their own iteration.
  Compiled for sm90 (``python tools/kernel_sass.py fp8-table-ahead``), the pipeliner then keeps
  two buffers at 3 stages, at 74 KB of shared memory for 128-token tiles and 40 KB for 64.
- ``registers``: no pipeliner (one stage); the next tile's K/V are loaded into registers while
  this tile is computed, the table a tile ahead of them (``fp8-registers-ahead``). The held tile
  costs registers: fewer programs an SM, or spills.

On the H200 neither beats the shipped launch (one buffer, four programs an SM): at 64 x 4,096 the
best ``table`` launch takes 209 µs and the best ``registers`` one 333 µs, against 161-165 µs
(``results/fp8_table_ahead_h200.json``). Chapter 13's section "Programs on an SM" reads the record.

Each candidate is chapter 13's kernel with its change made on the chapter's source text (so the
two cannot drift apart; a change to the chapter's loop stops this script with a clear error). For
chapter 8's shapes and three more it times chapter 13's shipped launch and the candidates at a few
launches, with the relative distance of each output from the shipped one (the same values are read
in the same order for 128-token tiles: 0). tests/test_benchmarks.py checks the candidates against
the shipped kernel under the CPU interpreter.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import sys
import tempfile
import textwrap
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import minipaged.runtime  # noqa: E402,F401  (before triton: the interpreter switch on CPU)
import triton.language as tl  # noqa: E402

import minipaged.kernels.fp8_kv_cache as fp8_module  # noqa: E402
from benchmarks.archive.gpu_record import gpu_main, shipped_case, time_candidate  # noqa: E402

CHAPTER_LOOP = """    for tile_start in range(start, end, TILE):
        positions = tile_start + tokens
        valid = positions < end
        block = tl.load(table_row + positions // BLOCK_SIZE, mask=valid,
                        other=0).to(tl.int64)
"""
AHEAD_LOOP = """    block_next = tl.load(table_row + (start + tokens) // BLOCK_SIZE,
                         mask=start + tokens < end, other=0).to(tl.int64)
    for tile_start in range(start, end, TILE):
        positions = tile_start + tokens
        valid = positions < end
        block = block_next                      # read during the previous tile
        ahead = positions + TILE
        block_next = tl.load(table_row + ahead // BLOCK_SIZE, mask=ahead < end,
                             other=0).to(tl.int64)
"""
# The same kernel with the next tile's K/V loaded into registers while this tile is computed
# (plain loads, no pipeliner: ``num_stages=1``), the table read a tile ahead of those loads.
CHAPTER_LOADS = CHAPTER_LOOP + """        in_block = positions % BLOCK_SIZE
        rows = block * stride_block + in_block * stride_token + head_base
        scale_offsets = block * stride_sblock + scale_head_base + in_block
        k = tl.load(k_ptr + rows[:, None] + dims[None, :],
                    mask=valid[:, None] & (dims < HEAD_DIM)[None, :], other=0.0)
        k_scale = tl.load(ks_ptr + scale_offsets, mask=valid, other=0.0)
"""
CHAPTER_V_LOADS = """        pair_ok = valid[:, None] & (halves < HEAD_DIM // 2)[None, :]
        pairs = tl.load(v_pairs_ptr + rows[:, None] // 2 + halves[None, :],
                        mask=pair_ok, other=0)
        v_even, v_odd = _e4m3_pairs(pairs, INTERPRETED)
        v_scale = tl.load(vs_ptr + scale_offsets, mask=valid, other=0.0)
"""
CHAPTER_END = """        m = m_new
"""
LOADS = """in_block = positions % BLOCK_SIZE
rows = block * stride_block + in_block * stride_token + head_base
scale_offsets = block * stride_sblock + scale_head_base + in_block
{k} = tl.load(k_ptr + rows[:, None] + dims[None, :],
            mask=valid[:, None] & (dims < HEAD_DIM)[None, :], other=0.0)
{ks} = tl.load(ks_ptr + scale_offsets, mask=valid, other=0.0)
{pairs} = tl.load(v_pairs_ptr + rows[:, None] // 2 + halves[None, :],
                mask=valid[:, None] & (halves < HEAD_DIM // 2)[None, :], other=0)
{vs} = tl.load(vs_ptr + scale_offsets, mask=valid, other=0.0)
ahead = positions + TILE
block_next = tl.load(table_row + ahead // BLOCK_SIZE, mask=ahead < end,
                     other=0).to(tl.int64)
"""
PREFETCH_LOADS = (
    textwrap.indent("""positions = start + tokens
valid = positions < end
block = tl.load(table_row + positions // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
""" + LOADS.format(k="k_next", ks="k_scale_next", pairs="pairs_next", vs="v_scale_next"),
                    "    ")
    + "    for tile_start in range(start, end, TILE):\n"
    + textwrap.indent("""k, k_scale, pairs, v_scale = k_next, k_scale_next, pairs_next, v_scale_next
positions = tile_start + TILE + tokens  # the next tile's loads, issued now
valid = positions < end
block = block_next
""" + LOADS.format(k="k_next", ks="k_scale_next", pairs="pairs_next", vs="v_scale_next")
                      + "valid = tile_start + tokens < end\n", "        "))
PREFETCH_V_LOADS = """        v_even, v_odd = _e4m3_pairs(pairs, INTERPRETED)
"""

# (kind, tile, warps, stages, register cap, programs an SM the split aims at)
# sm90 builds (python tools/kernel_sass.py fp8-table-ahead | fp8-registers-ahead ...):
# table ahead, 128 tokens at a cap of 128 or 168 registers, 74 KB: 3 programs an SM; 64 tokens,
# 40 KB: 4 programs uncapped (128 registers), 5 at a cap of 96; at 4 stages 58 KB, 3 programs;
# 128 tokens at 2 stages, 42 KB, one buffer: 4 programs at a cap of 128.
# registers ahead (one stage): 64 tokens, 4 warps: 206 registers, 2 programs, no spill (3 at a
# cap of 168, 49 spill reloads); 8 warps: 146 registers, 1 program (2 at a cap of 128, 6
# reloads); 128 tokens, 8 warps, cap 128: 2 programs, 100 reloads; 32 tokens, 4 warps: 150
# registers, 3 programs, no spill.
LAUNCHES = (("table", 128, 4, 3, 128, 3), ("table", 128, 4, 3, 168, 3),
            ("table", 64, 4, 3, None, 4), ("table", 64, 4, 3, 96, 5),
            ("table", 64, 4, 3, 112, 4), ("table", 64, 4, 4, None, 3),
            ("table", 128, 4, 2, 128, 4),
            ("registers", 64, 4, 1, None, 2), ("registers", 64, 4, 1, 168, 3),
            ("registers", 64, 8, 1, 128, 2), ("registers", 64, 8, 1, None, 1),
            ("registers", 128, 8, 1, 128, 2), ("registers", 32, 4, 1, None, 3))


def source_of(kernel) -> str:
    """A Triton function's source without its decorator (compiled or interpreted)."""
    text = getattr(kernel, "src", None) or textwrap.dedent(inspect.getsource(kernel.fn))
    return text[text.index("def "):]


def replace_all(text: str, edits) -> str:
    for old, new in edits:
        if old not in text:
            raise RuntimeError("chapter 13's tile loop changed: update this script's loop text")
        text = text.replace(old, new)
    return text


@functools.cache
def table_ahead_kernel(kind: str = "table"):
    """Chapter 13's ``_fp8_decode_kernel`` with its tile loop reading the table a tile ahead
    (``kind="table"``), or the next tile's K/V too, into registers (``"registers"``)."""
    loop = source_of(fp8_module._attend_fp8_tiles)
    edits = {"table": [(CHAPTER_LOOP, AHEAD_LOOP)],
             "registers": [(CHAPTER_LOADS, PREFETCH_LOADS),
                           (CHAPTER_V_LOADS, PREFETCH_V_LOADS)]}[kind]
    loop = replace_all(loop, [*edits, ("def _attend_fp8_tiles(", "def _attend_ahead(")])
    outer = source_of(fp8_module._fp8_decode_kernel).replace(
        "_attend_fp8_tiles(", "_attend_ahead(")
    path = Path(tempfile.mkdtemp(prefix="minipaged_")) / f"fp8_{kind}_ahead_kernel.py"
    path.write_text("import triton\nimport triton.language as tl\n"
                    "from minipaged.kernels.decode_attention import range_of_split\n"
                    "from minipaged.kernels.fp8_kv_cache import _e4m3_pairs\n\n\n"
                    f"@triton.jit\n{loop}\n\n@triton.jit\n{outer}")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._fp8_decode_kernel


@contextlib.contextmanager
def table_ahead_launch(tile: int | None = None, warps: int = 4, stages: int = 3,
                       maxnreg: int | None = None, programs_per_sm: int = 2,
                       kind: str = "table"):
    """Chapter 13's ``paged_attention`` running a candidate; with ``tile`` given, at that
    launch (on a GPU), else at the shipped one."""
    kernel, config = fp8_module._fp8_decode_kernel, fp8_module._fp8_launch_config
    fp8_module._fp8_decode_kernel = table_ahead_kernel(kind)
    if tile is not None:
        launch = fp8_module.Fp8Launch(tile, warps, stages, tl.float16, maxnreg, programs_per_sm)
        fp8_module._fp8_launch_config = lambda *args: launch
    try:
        yield
    finally:
        fp8_module._fp8_decode_kernel, fp8_module._fp8_launch_config = kernel, config


def timings(log=print) -> list[dict]:
    from benchmarks.bench_decode_attention import SIZES

    rows = []
    for batch, length in [*SIZES, (32, 8192), (128, 2048)]:
        with shipped_case(batch, length, log=log) as case:
            for kind, tile, warps, stages, cap, per_sm in LAUNCHES:
                row = {"batch": batch, "seq_len": length, "kind": kind, "tile": tile,
                       "warps": warps, "stages": stages, "max_registers": cap,
                       "programs_per_sm": per_sm, "bf16_us": case.bf16_us,
                       "chapter12_us": case.shipped_us}
                row["variant"] = (f"{kind} ahead: tile {tile} warps {warps} stages "
                                  f"{stages} cap {cap} aim {per_sm}")

                def candidate(launch=(tile, warps, stages, cap, per_sm), kind=kind):
                    with table_ahead_launch(*launch, kind=kind):
                        return case.run()
                rows.append(time_candidate(row, candidate, case, log))
    return rows


def main(argv=None) -> int:
    return gpu_main(argv, __doc__, "fp8_table_ahead_h200.json", lambda: {"rows": timings()})


if __name__ == "__main__":
    sys.exit(main())
