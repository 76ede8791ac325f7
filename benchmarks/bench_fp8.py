"""The FP8 KV cache (chapter 13) against the bf16 cache on a GPU: decode kernel and engine.

    python benchmarks/bench_fp8.py --out DIR [--quick] [--check] [--skip-engine]

Writes DIR/fp8_h200.json: {"device", "date", "command", "versions", "copy_bandwidth_bytes_per_s",
"kernel": [...], "engine": [...], "check": {...}}.

- ``kernel``: chapter 8's ``paged_attention`` on a bf16 paged cache against
  ``Fp8PagedKVCache.paged_attention`` on the same K/V quantized (per (slot, head) scales), at
  chapter 8's shapes (B=64 L=4096, B=8 L=32768, B=256 L=1024; 32 query / 8 KV heads, D 128, block
  size 16, shuffled blocks). Median µs (CUDA events, L2 flushed), speed-up, and the share of the
  measured copy bandwidth that each kernel's bytes reach (fp8 bytes include the scales).
- ``engine``: the engine's course benchmark (bench_engine.py's workload and random Qwen3-0.6B-shaped
  model, bf16) on chapter 13's engine (chapter 12's ``LLMEngine`` with ``FP8_ENGINE_PARTS``: its parts
  plus the ``"fp8"`` cache format) with ``kv_cache_dtype="auto"`` and ``"fp8"``, one after the other
  in this process:
  output tokens/s, the blocks the cache got from the same memory, and how many generated tokens
  agree with the auto run's before the first difference.
- ``check`` (``--check``, after the kernel rows): the chapter's correctness grid on the GPU (block sizes 1-32, GQA 1-8,
  D 64/128, fp32/bf16 queries, 1/3/auto splits) against attention over the dequantized cache, and a
  CUDA-graph capture of write + decode compared with eager.

``--quick`` on a CPU runs tiny shapes under the Triton interpreter to prove the script end to end
(timings meaningless); write that output outside results/.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import itertools
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import minipaged.runtime  # noqa: E402,F401  (before triton: the interpreter switch on CPU)
from benchmarks.bench_decode_attention import COPY_TBPS, SIZES, bench, kv_bytes  # noqa: E402
from benchmarks.bench_engine import (build_model, qwen3_06b_config, sync,  # noqa: E402
                                     workload)
from minipaged.memory.block_table import blocks_needed  # noqa: E402
from minipaged.kernels.decode_attention import paged_attention, paged_attention_reference  # noqa: E402
from minipaged.engine.llm_engine import CacheFormat, EngineParts, LLMEngine  # noqa: E402
from minipaged.kernels.fp8_kv_cache import (Fp8PagedKVCache, fp8_block_bytes,  # noqa: E402
                                            fp8_bytes_per_token, fp8_supported, new_fp8_cache,
                                            quantize_reference)
from minipaged.kernels.kv_cache import PagedKVCache  # noqa: E402

FP8_ENGINE_PARTS = EngineParts().with_cache_format("fp8", CacheFormat(new_fp8_cache,
                                                                    fp8_block_bytes))
"""chapter 13's engine: chapter 12's parts, and ``kv_cache_dtype="fp8"``"""

HEADS = (32, 8, 128)                                  # query heads, KV heads, head dim


def timed(fn, cuda: bool) -> float:
    """Median µs of fn(): CUDA events on a GPU, a few wall-clock runs on the CPU."""
    if cuda:
        return bench(fn)
    fn()
    runs = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - start) * 1e6)
    return sorted(runs)[1]


def paired_caches(batch, length, q_heads, kv_heads, head_dim, block_size, device, seed=0):
    """A bf16 (fp32 on CPU) paged cache with shuffled blocks and the fp8 cache of the same K/V."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    gen = torch.Generator(device=device).manual_seed(seed)
    blocks_per_seq = blocks_needed(length, block_size)
    num_blocks = batch * blocks_per_seq
    cache = PagedKVCache(1, num_blocks, block_size, kv_heads, head_dim, dtype, device)
    cache.storage.normal_(generator=gen)
    cache.storage[..., 0] *= 20.0                    # an outlier channel, as in the chapter
    fp8 = Fp8PagedKVCache(1, num_blocks, block_size, kv_heads, head_dim, device)
    for plane in (0, 1):                             # quantize in place, block by block
        for start in range(0, num_blocks, 4096):
            part = cache.storage[0, plane, start:start + 4096]      # [n, bs, H, D]
            q, s = quantize_reference(part)
            fp8.storage[0, plane, start:start + 4096] = q
            fp8.scales[0, plane, start:start + 4096] = s.transpose(1, 2)
    perm = torch.randperm(num_blocks, device=device, generator=gen)
    tables = perm.view(batch, blocks_per_seq).to(torch.int32)
    lens = torch.full((batch,), length, dtype=torch.int32, device=device)
    query = torch.randn(batch, q_heads, head_dim, device=device, generator=gen).to(dtype)
    return cache, fp8, query, tables, lens


def kernel_rows(quick: bool, device: str, log=print) -> list[dict]:
    sizes = [(2, 64), (1, 200)] if device == "cpu" else SIZES
    q_heads, kv_heads, head_dim = (4, 2, 16) if device == "cpu" else HEADS
    rows = []
    for batch, length in sizes:
        cache, fp8, query, tables, lens = paired_caches(batch, length, q_heads, kv_heads,
                                                        head_dim, 16, device)
        ours = lambda: paged_attention(query, cache, 0, tables, lens)  # noqa: E731
        mine = lambda: fp8.paged_attention(query, 0, tables, lens)      # noqa: E731
        out_bf16, out_fp8 = ours().float(), mine().float()
        bf16_us, fp8_us = timed(ours, device == "cuda"), timed(mine, device == "cuda")
        elem = cache.storage.element_size()
        bf16_bytes = kv_bytes(batch, length, kv_heads, head_dim, elem)
        fp8_bytes = batch * length * fp8_bytes_per_token(1, kv_heads, head_dim)
        row = {"batch": batch, "seq_len": length, "q_heads": q_heads, "kv_heads": kv_heads,
               "head_dim": head_dim, "block_size": 16, "bf16_us": bf16_us, "fp8_us": fp8_us,
               "speedup": bf16_us / fp8_us, "bf16_bytes": bf16_bytes, "fp8_bytes": fp8_bytes,
               "bf16_copy_fraction": bf16_bytes / (bf16_us * 1e-6) / (COPY_TBPS * 1e12),
               "fp8_copy_fraction": fp8_bytes / (fp8_us * 1e-6) / (COPY_TBPS * 1e12),
               "fp8_vs_bf16_rel_err": ((out_fp8 - out_bf16).norm() / out_bf16.norm()).item()}
        rows.append(row)
        log(f"B={batch:4d} L={length:6d}  bf16 {bf16_us:9.1f} us  fp8 {fp8_us:9.1f} us  "
            f"x{row['speedup']:.2f}  fp8 at {row['fp8_copy_fraction']:.0%} of copy bw  "
            f"err {row['fp8_vs_bf16_rel_err']:.1e}")
        del cache, fp8, query, tables, lens
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def fill(cache, lengths, gen, dtype, q_heads):
    """Write random K (one outlier channel) and V for `lengths`; query, tables, lengths."""
    bs, heads, dim, device = cache.block_size, cache.num_kv_heads, cache.head_dim, cache.device
    pool = torch.randperm(cache.num_blocks, generator=gen).tolist()
    width = max(blocks_needed(n, bs) for n in lengths)
    tables = torch.zeros(len(lengths), width, dtype=torch.int32)
    for b, n in enumerate(lengths):
        nb = blocks_needed(n, bs)
        tables[b, :nb] = torch.tensor([pool.pop() for _ in range(nb)], dtype=torch.int32)
        pos = torch.arange(n)
        slots = tables[b].long()[pos // bs] * bs + pos % bs
        k = torch.randn(n, heads, dim, generator=gen)
        k[:, :, 0] *= 20.0
        cache.write(0, k.to(device), torch.randn(n, heads, dim, generator=gen).to(device),
                    slots.to(device))
    query = torch.randn(len(lengths), q_heads, dim, generator=gen).to(device, dtype)
    return query, tables.to(device), torch.tensor(lengths, dtype=torch.int32).to(device)


def correctness_check(device: str, quick: bool) -> dict:
    """The chapter's grid, with the derived tolerances, and a CUDA-graph capture."""
    tolerance = {torch.float32: 1e-5, torch.bfloat16: 3 * 2 ** -8}
    dtypes = (torch.float32,) if device == "cpu" else (torch.float32, torch.bfloat16)
    grid = list(itertools.product((1, 2, 4, 16, 32), (1, 2, 4, 8), (64, 128), dtypes))
    if quick or device == "cpu":
        grid = [(1, 1, 64, dtypes[-1]), (4, 4, 64, dtypes[-1]), (16, 8, 128, dtypes[-1])]
    long_len = 3000 if device == "cuda" else 70
    worst, failures = {}, []
    for i, (bs, group, dim, dtype) in enumerate(grid):
        gen = torch.Generator().manual_seed(i)
        lengths = [1, max(1, bs - 1), bs, bs + 1, long_len]
        cache = Fp8PagedKVCache(1, sum(blocks_needed(n, bs) for n in lengths) + 1, bs, 2, dim,
                                device)
        query, tables, lens = fill(cache, lengths, gen, dtype, 2 * group)
        ref = paged_attention_reference(query, cache, 0, tables, lens)
        for splits in (1, 3, None):
            out = cache.paged_attention(query, 0, tables, lens, num_splits=splits).float()
            err = ((out - ref).norm() / ref.norm()).item()
            worst[str(dtype)] = max(worst.get(str(dtype), 0.0), err)
            if not err < tolerance[dtype]:
                failures.append({"block_size": bs, "group": group, "head_dim": dim,
                                 "dtype": str(dtype), "splits": splits, "rel_err": err})
    result = {"configurations": len(grid), "worst_rel_err": worst, "failures": failures,
              "tolerance": {str(k): v for k, v in tolerance.items()}}
    if device == "cuda":
        result["cuda_graph_equal"] = graph_check()
    return result


def graph_check() -> bool:
    """Capture write + decode in a CUDA graph; the replay must equal the eager call."""
    gen = torch.Generator().manual_seed(99)
    cache = Fp8PagedKVCache(1, 200, 16, 8, 128, "cuda")
    query, tables, lens = fill(cache, [7, 900, 1500], gen, torch.bfloat16, 32)
    key = torch.randn(3, 8, 128, device="cuda", dtype=torch.bfloat16)
    slots = torch.tensor([7, -1, 16 * 190 + 3], device="cuda")
    cache.write(0, key, key, slots)
    eager = cache.paged_attention(query, 0, tables, lens)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cache.write(0, key, key, slots)
        captured = cache.paged_attention(query, 0, tables, lens)
    graph.replay()
    torch.cuda.synchronize()
    return bool(torch.equal(captured, eager))


def engine_rows(args, device: str, log=print) -> list[dict]:
    from minipaged import SamplingParams

    num_requests = args.num_requests or (16 if args.quick else 256)
    max_tokens = args.max_tokens or (16 if args.quick else 512)
    lo, hi = (16, 64) if args.quick and device == "cpu" else (100, 1024)
    config = qwen3_06b_config(args.quick)
    model = build_model(config, device, torch.bfloat16 if device == "cuda" else torch.float32)
    prompts = workload(num_requests, lo, hi, config.vocab_size)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    rows, first = [], None
    for kv_cache_dtype in ("auto", "fp8"):
        row = {"kv_cache_dtype": kv_cache_dtype, "requests": num_requests,
               "prompt_len": [lo, hi], "max_tokens": max_tokens}
        try:
            llm = LLMEngine(model, parts=FP8_ENGINE_PARTS, kv_cache_dtype=kv_cache_dtype,
                            block_size=16, max_num_seqs=args.max_num_seqs,
                            num_blocks=None if device == "cuda" else 2048)
            llm.generate([[1 + i] * 32 for i in range(4)],
                         SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
            sync()
            start = time.perf_counter()
            outputs = llm.generate(prompts, params, use_tqdm=False)
            sync()
            seconds = time.perf_counter() - start
            tokens = [o.outputs[0].token_ids for o in outputs]
            row.update({"seconds": seconds, "output_tokens": sum(map(len, tokens)),
                        "tok_per_s": sum(map(len, tokens)) / seconds,
                        "num_blocks": llm.cache.num_blocks,
                        "block_bytes": FP8_ENGINE_PARTS.cache_formats[kv_cache_dtype]
                        .block_bytes(llm.model, 16)})
            row.update({k: v for k, v in llm.last_run_stats().items()
                        if isinstance(v, (int, float))})
            if first is None:
                first = tokens
            else:
                agree = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x))
                         for x, y in zip(first, tokens)]
                row["tokens_before_first_difference_mean"] = sum(agree) / len(agree)
            del llm, outputs
        except Exception as error:  # recorded; the other run still happens
            row["error"] = f"{type(error).__name__}: {error}"
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
        rows.append(row)
        log(json.dumps(row))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results", help="folder for fp8_h200.json")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (and model on CPU)")
    parser.add_argument("--check", action="store_true", help="first run the correctness grid")
    parser.add_argument("--skip-engine", action="store_true")
    parser.add_argument("--num-requests", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if not fp8_supported(device):
        print(f"{torch.cuda.get_device_name()} has no FP8 (compute capability < 8.9)")
        return 2
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join(sys.argv),
        "versions": {"torch": torch.__version__,
                     "triton": __import__("triton").__version__},
        "copy_bandwidth_bytes_per_s": COPY_TBPS * 1e12,
        "check": None, "kernel": [], "engine": [],
    }

    def save():
        (out_dir / "fp8_h200.json").write_text(json.dumps(result, indent=1))

    ok = True
    result["kernel"] = kernel_rows(args.quick, device)
    save()
    if args.check:
        result["check"] = correctness_check(device, args.quick)
        ok = not result["check"]["failures"] and result["check"].get("cuda_graph_equal", True)
        print("check:", json.dumps(result["check"]), flush=True)
        save()
    if not args.skip_engine:
        result["engine"] = engine_rows(args, device)
        save()
    return 0 if ok and all("error" not in r for r in result["engine"]) else 1


if __name__ == "__main__":
    sys.exit(main())
