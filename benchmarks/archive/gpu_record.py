"""What the GPU experiments share: their command line, the header of their JSON record, one
decode problem with chapter 13's kernel timed on it, and the timing of one candidate against it."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import triton

from benchmarks.bench_decode_attention import COPY_TBPS, bench


def write_gpu_record(out: str | Path, name: str, **fields) -> Path:
    """Write ``out/name``: device, date, command, versions and the copy bandwidth the
    fractions are of, then ``fields``."""
    record = {"device": torch.cuda.get_device_name(),
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "command": "python " + " ".join(sys.argv),
              "versions": {"torch": torch.__version__, "triton": triton.__version__},
              "copy_bandwidth_bytes_per_s": COPY_TBPS * 1e12, **fields}
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    (path / name).write_text(json.dumps(record, indent=1))
    return path / name


def gpu_main(argv, doc: str, name: str, collect, needs_fp8: bool = True) -> int:
    """An experiment's ``main``: ``--out DIR``; exit 2 with a clear line without the GPU it
    needs; else ``collect()``'s fields written to ``DIR/name``."""
    from minipaged.kernels.fp8_kv_cache import fp8_supported

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", default="results", help="folder for the JSON record")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or (needs_fp8 and not fp8_supported("cuda")):
        print("needs a GPU with FP8 (compute capability 8.9 or newer)" if needs_fp8
              else "needs a GPU")
        return 2
    write_gpu_record(args.out, name, **collect())
    return 0


def time_candidate(row: dict, call, case, log=print) -> dict:
    """Fill ``row`` with one candidate's median µs, speed-up over bf16, share of the copy
    bandwidth and relative distance from chapter 13's output, on ``case`` (a
    ``shipped_case``); a candidate that fails (out of shared memory, for one) is recorded
    with its error."""
    try:
        out = call().float()
        row["rel_distance_from_chapter12"] = ((out - case.reference).norm()
                                              / case.reference.norm()).item()
        row["us"] = bench(call)
    except Exception as error:
        row["error"] = f"{type(error).__name__}: {str(error)[:300]}"
        log(f"  {row}")
        return row
    row["speedup_over_bf16"] = case.bf16_us / row["us"]
    row["copy_fraction"] = case.fp8_bytes / (row["us"] * 1e-6) / (COPY_TBPS * 1e12)
    log(f"  {row.get('variant', '')} {row['us']:.1f} us (x{row['speedup_over_bf16']:.2f}, "
        f"{row['copy_fraction']:.0%} of copy)")
    return row


@contextlib.contextmanager
def shipped_case(batch: int, length: int, q_heads: int = 32, log=print, device="cuda",
                 timer=bench):
    """A decode problem on ``device`` (8 KV heads, head dim 128, blocks of 16) with chapter 8's
    bf16 kernel and chapter 13's fp8 kernel timed on it. Yields ``fp8, query, tables, lens``,
    ``run`` (chapter 13's call), its output ``reference`` (fp32), ``bf16_us``, ``shipped_us``
    and ``fp8_bytes`` (what the fp8 kernel reads), timed by ``timer``; frees the GPU memory
    after."""
    from benchmarks.bench_fp8 import paired_caches
    from minipaged.kernels.decode_attention import paged_attention
    from minipaged.kernels.fp8_kv_cache import fp8_bytes_per_token

    cache, fp8, query, tables, lens = paired_caches(batch, length, q_heads, 8, 128, 16, device)
    case = SimpleNamespace(fp8=fp8, query=query, tables=tables, lens=lens,
                           run=lambda: fp8.paged_attention(query, 0, tables, lens),
                           fp8_bytes=batch * length * fp8_bytes_per_token(1, 8, 128))
    case.reference = case.run().float()
    case.bf16_us = timer(lambda: paged_attention(query, cache, 0, tables, lens))
    case.shipped_us = timer(case.run)
    log(f"B={batch} L={length} Hq={q_heads}: bf16 {case.bf16_us:.1f} us, chapter 13 "
        f"{case.shipped_us:.1f} us (x{case.bf16_us / case.shipped_us:.2f})")
    try:
        yield case
    finally:
        case.__dict__.clear()
        cache = fp8 = query = tables = lens = None  # noqa: F841  (the closures' cells too)
        torch.cuda.empty_cache()
