"""The header every GPU experiment's JSON record carries, and the writing of it."""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path

import torch
import triton

from benchmarks.bench_decode_attention import COPY_TBPS


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
