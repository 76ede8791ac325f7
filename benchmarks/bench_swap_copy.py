"""Swap bandwidth: ``PagedKVCache.swap_out`` / ``swap_in`` against a pageable copy, and the link itself.

    python benchmarks/bench_swap_copy.py --out DIR     (needs a GPU)

Qwen3-0.6B's block geometry (28 layers, 16 tokens, 8 KV heads, D 128, bf16: 1.75 MiB a block). For a
swap of 1, 16 and 64 blocks (64 is about one 1,000-token sequence), in one run:

- ``minipaged``: the library's swap, staged through page-locked memory;
- ``pageable``: the same gather / transfer / scatter with the host side of the transfer in ordinary
  pageable memory (what chapter 7 did first);
- ``link``: one contiguous copy of the same bytes between the GPU and a page-locked buffer, the
  most a swap can get.

Every variant's result is checked equal to the library's. Median of ``--repeats`` timings (wall clock
around a synchronized call). Writes DIR/swap_copy.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from minipaged.kernels.kv_cache import PagedKVCache  # noqa: E402


def pageable_copy(src: PagedKVCache, dst: PagedKVCache, pairs) -> None:
    """The first version: gather, ``.to()`` (pageable on the host side), scatter by indexing."""
    s, d = (torch.tensor(x) for x in zip(*pairs))
    staged = src.storage[:, :, s.to(src.storage.device)]
    dst.storage[:, :, d.to(dst.storage.device)] = staged.to(dst.storage.device)


def timed(fn, repeats: int) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_swap_copy needs a GPU: a swap moves blocks between GPU and host memory")
        return 2

    gpu = PagedKVCache(28, 1024, 16, 8, 128, dtype=torch.bfloat16, device="cuda")
    gpu.storage.normal_()
    host = gpu.cpu_pool(256)
    block_bytes = gpu.storage[:, :, 0].numel() * gpu.storage.element_size()
    rows = []
    for n in (1, 16, 64):
        gpu_blocks = torch.randperm(1024)[:n].tolist()
        host_blocks = torch.randperm(256)[:n].tolist()
        out_pairs = list(zip(gpu_blocks, host_blocks))
        in_pairs = list(zip(host_blocks, gpu_blocks[::-1]))
        nbytes = n * block_bytes
        link_gpu = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda")
        link_host = torch.empty(nbytes // 2, dtype=torch.bfloat16, pin_memory=True)
        results = {
            "out_minipaged": timed(lambda: gpu.swap_out(host, out_pairs), args.repeats),
            "out_pageable": timed(lambda: pageable_copy(gpu, host, out_pairs), args.repeats),
            "out_link": timed(lambda: link_host.copy_(link_gpu), args.repeats),
            "in_minipaged": timed(lambda: gpu.swap_in(host, in_pairs), args.repeats),
            "in_pageable": timed(lambda: pageable_copy(host, gpu, in_pairs), args.repeats),
            "in_link": timed(lambda: link_gpu.copy_(link_host), args.repeats),
        }
        # the two implementations must agree, byte for byte
        gpu.swap_out(host, out_pairs)
        mine = host.storage[:, :, host_blocks].clone()
        host.storage.zero_()
        pageable_copy(gpu, host, out_pairs)
        same_out = torch.equal(mine, host.storage[:, :, host_blocks])
        gpu.swap_in(host, in_pairs)
        mine = gpu.storage[:, :, gpu_blocks[::-1]].clone()
        gpu.storage[:, :, gpu_blocks[::-1]] = 0
        pageable_copy(host, gpu, in_pairs)
        same_in = torch.equal(mine, gpu.storage[:, :, gpu_blocks[::-1]])
        row = {"blocks": n, "bytes": nbytes, "identical": same_out and same_in}
        for key, seconds in results.items():
            row[f"{key}_us"] = seconds * 1e6
            row[f"{key}_gb_per_s"] = nbytes / seconds / 1e9
        rows.append(row)
        print(json.dumps(row), flush=True)

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "swap_copy.json").write_text(json.dumps({
        "device": torch.cuda.get_device_name(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join(sys.argv), "versions": {"torch": torch.__version__},
        "block_bytes": block_bytes, "geometry": "28 layers, 16 tokens, 8 KV heads, D 128, bf16",
        "rows": rows}, indent=1) + "\n")
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
