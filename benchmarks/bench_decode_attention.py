"""Decode attention on a paged KV cache vs its peers, on a GPU; results as JSON.

    python benchmarks/bench_decode_attention.py --out DIR [--quick] [--tune] [--no-flex]
    python benchmarks/bench_decode_attention.py --out DIR --ragged [--quick]
    python benchmarks/bench_decode_attention.py --out DIR --balanced [--quick]

Writes DIR/decode_attention.json and DIR/kv_cache_layout.json, each
{"device", "date", "command", "rows": [{"shape": {...}, "impl": ..., "median_us": ..., "gbps": ...}]}.
Peers, on the same K/V values: torch SDPA on a contiguous cache (the bar), gather-into-contiguous then
SDPA, and torch's FlexAttention-based PagedAttention. GB/s counts the bytes of K and V a decode step
must read (every cached token once); the H200's measured copy bandwidth is 4.29 TB/s.

``--ragged`` writes DIR/decode_attention_ragged.json instead: batches whose lengths are uniform in
1..L (as in real serving), each timed with the split rule of the package (every program cuts its
own sequence's length), with the rule that cuts every sequence like the longest possible one (a
full table row), on tables as wide as the lengths need and as wide as a CUDA graph's (40,960
tokens) (with ``--sweep``, also a sweep of the split parameters); and the uniform shapes against SDPA on a contiguous
cache. Fractions are of the copy bandwidth.

``--balanced`` writes DIR/decode_attention_balanced.json: the same ragged batches (tables as wide as
a CUDA graph's where the lengths are shorter) with chapter 8's split-KV and with the appendix's work
split by tokens (``plan_decode_work``, Performance notes), and the uniform shapes against SDPA on a contiguous cache,
all timed as CUDA graph replays (``triton.testing.do_bench_cudagraph``), as the engine runs them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import minipaged.kernels.decode_attention as decode_attention  # noqa: E402
from minipaged.kernels.decode_attention import paged_attention  # noqa: E402
from minipaged.kernels.kv_cache import PagedKVCache, write_kv_reference  # noqa: E402

SIZES = [(64, 4096), (8, 32768), (256, 1024)]          # (batch, tokens per sequence)
HEADS = [(32, 8, 128), (16, 8, 128)]                    # (query heads, KV heads, head dim)
COPY_TBPS = 4.29


def bench(fn, warmup_ms: int = 25, rep_ms: int = 200) -> float:
    """Median microseconds of fn() with CUDA events (triton's do_bench, L2 flushed between runs)."""
    import triton.testing

    return 1000.0 * triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")


def kv_bytes(batch: int, length: int, kv_heads: int, head_dim: int, elem: int = 2) -> int:
    return 2 * batch * length * kv_heads * head_dim * elem


class Case:
    """One decode problem: a paged bf16 cache with shuffled blocks, and the same K/V contiguous."""

    def __init__(self, batch, length, q_heads, kv_heads, head_dim, block_size, layout="NHD",
                 seed=0, contiguous=True):
        self.shape = dict(batch=batch, seq_len=length, q_heads=q_heads, kv_heads=kv_heads,
                          head_dim=head_dim, block_size=block_size, layout=layout)
        gen = torch.Generator(device="cuda").manual_seed(seed)
        blocks_per_seq = -(-length // block_size)
        num_blocks = batch * blocks_per_seq
        self.cache = PagedKVCache(1, num_blocks, block_size, kv_heads, head_dim, torch.bfloat16,
                                  "cuda", layout)
        self.cache.storage.normal_(generator=gen)
        perm = torch.randperm(num_blocks, device="cuda", generator=gen)   # a busy server's pool
        self.tables = perm.view(batch, blocks_per_seq).to(torch.int32)
        self.lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
        self.query = torch.randn(batch, q_heads, head_dim, device="cuda", generator=gen,
                                 dtype=torch.bfloat16)
        positions = torch.arange(length, device="cuda")
        self.token_blocks = self.tables.long()[:, positions // block_size]        # [B, L]
        self.token_offsets = (positions % block_size).expand(batch, -1)
        self.k = self.v = None
        if contiguous:
            self.k, self.v = self.gather()
            self.k, self.v = self.k.contiguous(), self.v.contiguous()            # [B, Hkv, L, D]
        self.bytes = kv_bytes(batch, length, kv_heads, head_dim)

    def gather(self):
        """All sequences' K and V as [B, Hkv, L, D] views of freshly gathered tensors."""
        view = self.cache.token_view
        k = view(self.cache.key_cache(0))[self.token_blocks, self.token_offsets]   # [B, L, H, D]
        v = view(self.cache.value_cache(0))[self.token_blocks, self.token_offsets]
        return k.transpose(1, 2), v.transpose(1, 2)

    def ours(self, **kw):
        return paged_attention(self.query, self.cache, 0, self.tables, self.lens, **kw)

    def sdpa_gqa(self, k=None, v=None):
        q = self.query[:, :, None, :]
        k = self.k if k is None else k
        v = self.v if v is None else v
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)[:, :, 0]

    def sdpa_grouped(self, k=None, v=None):
        """The query heads of a GQA group as rows of one KV head's query: plain MHA, no expansion."""
        batch, q_heads, head_dim = self.query.shape
        kv_heads = self.shape["kv_heads"]
        q = self.query.view(batch, kv_heads, q_heads // kv_heads, head_dim)
        k = self.k if k is None else k
        v = self.v if v is None else v
        return torch.nn.functional.scaled_dot_product_attention(q, k, v).reshape(self.query.shape)

    def gather_sdpa(self):
        k, v = self.gather()
        return self.sdpa_grouped(k, v)


def flex_paged_fn(case: Case):
    """torch's FlexAttention PagedAttention on the same pages, or raise with the reason."""
    from torch.nn.attention.experimental._paged_attention import PagedAttention
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    s = case.shape
    page = s["block_size"]
    batch, length = s["batch"], s["seq_len"]
    n_pages = case.cache.num_blocks
    pa = PagedAttention(n_pages, page, batch, device="cuda")
    pa.page_table.fill_(-1)
    blocks_per_seq = case.tables.shape[1]
    pa.page_table[:, :blocks_per_seq] = case.tables.long()
    rows = torch.arange(batch, device="cuda")[:, None].expand(-1, blocks_per_seq)
    pa.physical_to_logical[rows, case.tables.long()] = torch.arange(blocks_per_seq, device="cuda")
    pa.capacity[:] = blocks_per_seq * page
    # flex wants [1, H, pages * page, D]: one row per slot, heads outer.
    kc = case.cache.token_view(case.cache.key_cache(0)).reshape(n_pages * page, s["kv_heads"], -1)
    vc = case.cache.token_view(case.cache.value_cache(0)).reshape(n_pages * page, s["kv_heads"], -1)
    k_cache = kc.permute(1, 0, 2).contiguous()[None]
    v_cache = vc.permute(1, 0, 2).contiguous()[None]
    lens = case.lens

    def causal_len(b, h, q_idx, kv_idx):
        return kv_idx < lens[b]

    logical = create_block_mask(causal_len, batch, None, 1, length, device="cuda",
                                BLOCK_SIZE=(128, page))
    mask = pa.convert_logical_block_mask(logical)
    compiled = torch.compile(flex_attention, dynamic=False)
    q = case.query[:, :, None, :]

    def run():
        return compiled(q, k_cache, v_cache, block_mask=mask, enable_gqa=True)[:, :, 0]

    return run


def rel_err(out, ref) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def row(case: Case, impl: str, us: float, **extra) -> dict:
    r = {"shape": dict(case.shape), "impl": impl, "median_us": round(us, 2),
         "gbps": round(case.bytes / us / 1e3, 1)}
    r.update(extra)
    return r


def decode_rows(quick: bool = False, flex: bool = True, log=print) -> list[dict]:
    """Our kernel and its peers at every benchmark shape (quick: one shape, block size 16)."""
    rows, flex_budget_s = [], 150.0
    sizes = SIZES[:1] if quick else SIZES
    heads = HEADS[:1] if quick else HEADS
    block_sizes = (16,) if quick else (16, 32, 64)
    for (batch, length), (hq, hkv, d), bs in ((a, b, c) for a in sizes for b in heads for c in block_sizes):
        case = Case(batch, length, hq, hkv, d, bs)
        ref = case.sdpa_grouped()
        ours_out = case.ours(out=torch.full_like(case.query, float("nan")))
        err = rel_err(ours_out, ref)
        assert err < 2e-2, f"paged_attention disagrees with SDPA at {case.shape}: {err:.2e}"
        assert rel_err(case.sdpa_gqa(), ref) < 2e-2 and rel_err(case.gather_sdpa(), ref) < 1e-6
        splits = decode_attention.choose_num_splits(batch, hkv, length, case.query.device)
        rows.append(row(case, "triton_paged", bench(case.ours), rel_err=round(err, 5), splits=splits))
        if bs == 16:   # peers that do not depend on the block size: once per shape
            rows.append(row(case, "sdpa_contiguous_gqa", bench(case.sdpa_gqa)))
            rows.append(row(case, "sdpa_contiguous_grouped", bench(case.sdpa_grouped)))
        rows.append(row(case, "gather_then_sdpa", bench(case.gather_sdpa)))
        if flex and bs == 16 and flex_budget_s > 0:
            start = time.time()
            try:
                fn = flex_paged_fn(case)
                flex_err = rel_err(fn(), ref)
                if flex_err > 2e-2:
                    raise RuntimeError(f"wrong result, relative error {flex_err:.2e}")
                rows.append(row(case, "flex_paged", bench(fn), rel_err=round(flex_err, 5)))
            except Exception as error:  # record why, keep measuring the others
                rows.append({"shape": dict(case.shape), "impl": "flex_paged", "median_us": None,
                             "gbps": None, "error": f"{type(error).__name__}: {str(error)[:300]}"})
            flex_budget_s -= time.time() - start
        for r in rows[-5:]:
            if r["shape"] == case.shape:
                log(f"{str(tuple(case.shape.values())):48s} {r['impl']:26s} "
                    f"{r['median_us'] or float('nan'):9.1f} us {r['gbps'] or float('nan'):7.0f} GB/s"
                    + (f"  {r['error'][:80]}" if "error" in r else ""))
        del case
        torch.cuda.empty_cache()
    return rows


def block_size_rows(log=print) -> list[dict]:
    """Kernel time vs block size at a fixed 64 x 4,096 tokens (chapter 3's trade-off, in time)."""
    rows = []
    for bs in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        case = Case(64, 4096, 32, 8, 128, bs, contiguous=False)
        rows.append(row(case, "triton_paged", bench(case.ours), sweep="block_size"))
        log(f"block size {bs:4d}: {rows[-1]['median_us']:8.1f} us {rows[-1]['gbps']:7.0f} GB/s")
        del case
    return rows


def layout_rows(quick: bool = False, log=print) -> list[dict]:
    """Decode attention and the write kernel on NHD vs HND caches (chapter 7's choice)."""
    rows = []
    for bs in ((16,) if quick else (16, 64)):
        for layout in ("NHD", "HND"):
            case = Case(64, 4096, 32, 8, 128, bs, layout=layout, contiguous=False)
            rows.append(row(case, f"attention {layout}", bench(case.ours)))
            n = 4096                                  # a prefill chunk's worth of new tokens
            key = torch.randn(n, 8, 128, device="cuda", dtype=torch.bfloat16)
            slots = torch.randperm(case.cache.num_slots, device="cuda")[:n]
            moved = 2 * 2 * n * 8 * 128 * 2          # K and V, read once and written once
            for impl, fn in ((f"write {layout}", lambda: case.cache.write(0, key, key, slots)),
                             (f"write_reference {layout}",
                              lambda: write_kv_reference(case.cache, 0, key, key, slots))):
                us = bench(fn)
                rows.append({"shape": dict(case.shape, new_tokens=n), "impl": impl,
                             "median_us": round(us, 2), "gbps": round(moved / us / 1e3, 1)})
            log(f"{layout} block {bs}: attention {rows[-3]['median_us']:.1f} us, write {n} tokens "
                f"{rows[-2]['median_us']:.1f} us (reference {rows[-1]['median_us']:.1f} us)")
            del case
    return rows


def tune_rows(log=print) -> list[dict]:
    """Launch configurations and split factors of our kernel at the three sizes (block size 16)."""
    rows = []
    original = decode_attention.decode_launch_config
    try:
        for batch, length in SIZES:
            for bs in (16,):
                case = Case(batch, length, 32, 8, 128, bs, contiguous=False)
                auto = decode_attention.choose_num_splits(batch, 8, length, case.query.device)
                for tile in (32, 64, 128):
                    for warps in (4, 8):
                        for stages in (2, 3, 4):
                            decode_attention.decode_launch_config = lambda *a, c=(tile, warps, stages): c
                            for splits in sorted({1, auto, 2 * auto, max(1, auto // 2)}):
                                try:
                                    us = bench(lambda: case.ours(num_splits=splits), 10, 50)
                                except Exception as error:
                                    log(f"tile {tile} warps {warps} stages {stages}: {error}")
                                    break
                                rows.append(row(case, "triton_paged", us, tile=tile, warps=warps,
                                                stages=stages, splits=splits, sweep="tune"))
                best = min((r for r in rows if r["shape"] == case.shape), key=lambda r: r["median_us"])
                log(f"{batch}x{length} bs{bs} best: {best['median_us']:.1f} us {best['gbps']:.0f} GB/s "
                    f"tile {best['tile']} warps {best['warps']} stages {best['stages']} "
                    f"splits {best['splits']} (auto {auto})")
                del case
    finally:
        decode_attention.decode_launch_config = original
    return rows


RAGGED_SIZES = [(1, 131072), (8, 131072), (8, 16384), (64, 32768), (64, 2048), (512, 4096),
                (512, 2048)]
RAGGED_HEADS = [(32, 8, 128), (32, 4, 64)]     # GQA groups 4 and 8, head dims 128 and 64
GRAPH_TOKENS = 40960                           # Qwen3's max_model_len: a captured graph's tables


class RaggedCase(Case):
    """A batch whose lengths are uniform in 1..length; tables ``width`` tokens wide."""

    def __init__(self, batch, length, q_heads, kv_heads, head_dim, block_size, width=None,
                 seed=0):
        self.shape = dict(batch=batch, max_len=length, q_heads=q_heads, kv_heads=kv_heads,
                          head_dim=head_dim, block_size=block_size, ragged=True)
        gen = torch.Generator(device="cuda").manual_seed(seed)
        self.lens = torch.randint(1, length + 1, (batch,), device="cuda", generator=gen,
                                  dtype=torch.int32)
        blocks = (self.lens.long() + block_size - 1) // block_size
        num_blocks = int(blocks.sum())
        self.cache = PagedKVCache(1, num_blocks, block_size, kv_heads, head_dim, torch.bfloat16,
                                  "cuda")
        self.cache.storage.normal_(generator=gen)
        perm = torch.randperm(num_blocks, device="cuda", generator=gen).to(torch.int32)
        cols = -(-(width or length) // block_size)
        self.tables = torch.zeros(batch, cols, dtype=torch.int32, device="cuda")
        starts = torch.cumsum(blocks, 0) - blocks
        for b in range(batch):
            n = int(blocks[b])
            self.tables[b, :n] = perm[int(starts[b]):int(starts[b]) + n]
        self.query = torch.randn(batch, q_heads, head_dim, device="cuda", generator=gen,
                                 dtype=torch.bfloat16)
        self.k = self.v = None
        self.bytes = 2 * int(self.lens.sum()) * kv_heads * head_dim * 2


def ragged_rows(quick: bool = False, sweep: bool = False, log=print) -> list[dict]:
    """Ragged batches: the package's split rule against cutting like the longest sequence."""
    from minipaged.kernels.decode_attention import paged_attention_reference, split_plan

    rows = []
    sizes = RAGGED_SIZES[1:2] if quick else RAGGED_SIZES
    heads = RAGGED_HEADS[:1] if quick else RAGGED_HEADS
    copy_gbps = COPY_TBPS * 1e3
    for (batch, length), (hq, hkv, d) in ((a, b) for a in sizes for b in heads):
        for width in (length, GRAPH_TOKENS if length < GRAPH_TOKENS else None):
            if width is None:
                continue
            case = RaggedCase(batch, length, hq, hkv, d, 16, width=width)
            ref = paged_attention_reference(case.query[:4], case.cache, 0, case.tables[:4],
                                            case.lens[:4])
            err = rel_err(case.ours()[:4], ref)
            assert err < 2e-2, f"paged_attention disagrees with the reference: {err:.2e}"
            max_tokens = case.tables.shape[1] * 16
            plan = split_plan(case.query, case.cache, case.tables)
            splits, granule = plan.num_splits, plan.granule
            longest = decode_attention.split_ranges(max_tokens, splits, granule)[0]
            variants = {"per-sequence ranges (package)": {},
                        "ranges of the longest sequence": {"num_splits": splits,
                                                           "min_split": longest}}
            if width == length and sweep:
                for pps in (2, 4, 8):
                    for min_split in (256, 512, 1024):
                        n = decode_attention.choose_num_splits(batch, hkv, max_tokens,
                                                               case.query.device,
                                                               programs_per_sm=pps)
                        variants[f"sweep pps={pps} min={min_split}"] = {
                            "num_splits": n, "min_split": min_split}
            for name, kw in variants.items():
                us = bench(lambda: case.ours(**kw), *((10, 60) if sweep else (25, 200)))
                r = row(case, "triton_paged", us, variant=name, table_tokens=width,
                        splits=kw.get("num_splits", splits), rel_err=round(err, 5))
                r["copy_fraction"] = round(r["gbps"] / copy_gbps, 3)
                rows.append(r)
                if not name.startswith("sweep"):
                    log(f"B={batch:3d} L={length:6d} H={hq}/{hkv} D={d:3d} table {width:6d}: "
                        f"{name:32s} {us:8.1f} us {r['copy_fraction']:6.1%} of copy")
            del case
            torch.cuda.empty_cache()
    for (batch, length), (hq, hkv, d) in ((a, b) for a in SIZES for b in HEADS[:1]):
        case = Case(batch, length, hq, hkv, d, 16)
        ours, sdpa = bench(case.ours), min(bench(case.sdpa_gqa), bench(case.sdpa_grouped))
        rows.append(row(case, "triton_paged", ours, variant="uniform",
                        vs_sdpa_contiguous=round(sdpa / ours, 3)))
        log(f"uniform B={batch} L={length}: {ours:.1f} us, {sdpa / ours:.2f}x SDPA contiguous")
        del case
    return rows


def bench_graph(fn) -> float:
    """Median microseconds of fn() replayed in a CUDA graph: no host launch time."""
    import triton.testing

    return 1000.0 * triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")


def balanced_rows(quick: bool = False, log=print) -> dict:
    """Ragged and uniform batches: chapter 8's split-KV against the work split by tokens."""
    from minipaged.kernels.decode_attention import paged_attention_reference
    from minipaged.kernels.balanced_decode import balanced_paged_attention, plan_decode_work

    copy = COPY_TBPS * 1e12
    ragged = []
    sizes = RAGGED_SIZES[1:2] if quick else RAGGED_SIZES
    heads = RAGGED_HEADS[:1] if quick else RAGGED_HEADS
    for (batch, length), (hq, hkv, d) in ((a, b) for a in sizes for b in heads):
        case = RaggedCase(batch, length, hq, hkv, d, 16, width=max(length, GRAPH_TOKENS))
        lens = case.lens.tolist()
        start = time.perf_counter()
        work = plan_decode_work(lens, case.cache)
        plan_us = 1e6 * (time.perf_counter() - start)
        ref = paged_attention_reference(case.query, case.cache, 0, case.tables, case.lens)
        balanced = lambda: balanced_paged_attention(case.query, case.cache, 0, case.tables,
                                                    case.lens, work)
        err = max(rel_err(case.ours(), ref), rel_err(balanced(), ref))
        assert err < 2e-2, f"a decode kernel disagrees with the reference: {err:.2e}"
        package_us, balanced_us = bench_graph(case.ours), bench_graph(balanced)
        ragged.append(dict(
            batch=batch, max_len=length, q_heads=hq, kv_heads=hkv, head_dim=d,
            table_tokens=case.tables.shape[1] * 16, kv_bytes=case.bytes,
            package_us=round(package_us, 2),
            package_fraction=round(case.bytes / (package_us * 1e-6) / copy, 3),
            balanced_us=round(balanced_us, 2),
            balanced_fraction=round(case.bytes / (balanced_us * 1e-6) / copy, 3),
            items=work.items.shape[0], chunk=work.chunk, any_split=work.any_split,
            plan_us=round(plan_us, 1), rel_err=round(err, 5)))
        log(f"B={batch:3d} L={length:6d} H={hq}/{hkv} D={d:3d}: chapter 8 {package_us:7.1f} us "
            f"({ragged[-1]['package_fraction']:.0%}), by tokens {balanced_us:7.1f} us "
            f"({ragged[-1]['balanced_fraction']:.0%}), {work.items.shape[0]} items")
        del case
        torch.cuda.empty_cache()
    uniform = []
    for batch, length in SIZES[:1] if quick else SIZES:
        case = Case(batch, length, 32, 8, 128, 16)
        work = plan_decode_work([length] * batch, case.cache)
        balanced_us = bench_graph(lambda: balanced_paged_attention(
            case.query, case.cache, 0, case.tables, case.lens, work))
        sdpa_us = min(bench_graph(case.sdpa_gqa), bench_graph(case.sdpa_grouped))
        uniform.append(dict(batch=batch, seq_len=length, sdpa_us=round(sdpa_us, 2),
                            package_us=round(bench_graph(case.ours), 2),
                            balanced_us=round(balanced_us, 2),
                            balanced_vs_sdpa=round(sdpa_us / balanced_us, 3)))
        log(f"uniform B={batch} L={length}: by tokens {balanced_us:.1f} us, "
            f"{sdpa_us / balanced_us:.2f}x SDPA contiguous")
        del case
    return {"timing": "CUDA graph replays, median (triton.testing.do_bench_cudagraph)",
            "ragged": ragged, "uniform": uniform}


def header(command: str) -> dict:
    props = torch.cuda.get_device_properties(0)
    return {"device": f"{props.name} ({props.multi_processor_count} SMs, "
                      f"{props.total_memory / 2**30:.0f} GiB), torch {torch.__version__}",
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": command, "copy_bandwidth_tbps": COPY_TBPS,
            **({"commit": os.environ["GIT_COMMIT"]} if os.environ.get("GIT_COMMIT") else {})}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results", help="folder for the JSON files")
    parser.add_argument("--quick", action="store_true", help="one shape only")
    parser.add_argument("--tune", action="store_true", help="also sweep launch configurations")
    parser.add_argument("--no-flex", action="store_true", help="skip FlexAttention (slow to compile)")
    parser.add_argument("--ragged", action="store_true", help="only the ragged batches")
    parser.add_argument("--balanced", action="store_true",
                        help="only chapter 8's split-KV vs the work split by tokens")
    parser.add_argument("--sweep", action="store_true",
                        help="with --ragged: also sweep the split parameters")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no GPU: nothing to measure (the chapters plot the recorded results/*.json)")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/bench_decode_attention.py " + " ".join(sys.argv[1:])
    torch.backends.cuda.matmul.allow_tf32 = False
    save = lambda name, rows: (out / name).write_text(json.dumps(header(command) | {"rows": rows},
                                                                            indent=1))
    if args.balanced:
        (out / "decode_attention_balanced.json").write_text(json.dumps(
            header(command) | balanced_rows(args.quick), indent=1))
        return 0
    if args.ragged:
        save("decode_attention_ragged.json", ragged_rows(args.quick, args.sweep))
        return 0
    if args.tune:
        save("decode_attention_tune.json", tune_rows())
    rows = decode_rows(args.quick, flex=not args.no_flex)
    save("decode_attention.json", rows)          # written at once: what follows may run out of time
    print(summary(rows), flush=True)
    if not args.quick:
        rows += block_size_rows()
        save("decode_attention.json", rows)
    save("kv_cache_layout.json", layout_rows(args.quick))
    return 0


def summary(rows: list[dict]) -> str:
    """Our kernel vs the best SDPA-contiguous time per shape, as a short table."""
    lines = [f"{'shape (B, L, Hq, Hkv, D, bs)':34s} {'ours us':>8s} {'sdpa us':>8s} {'ratio':>6s} "
             f"{'gather':>7s} {'flex':>7s} {'GB/s':>6s}"]
    key = lambda r: (r["shape"]["batch"], r["shape"]["seq_len"], r["shape"]["q_heads"])
    for r in rows:
        if r["impl"] != "triton_paged" or r.get("sweep"):
            continue
        same = [x for x in rows if key(x) == key(r) and not x.get("sweep")]
        sdpa = min(x["median_us"] for x in same if x["impl"].startswith("sdpa"))
        gather = [x["median_us"] for x in same if x["impl"] == "gather_then_sdpa"
                  and x["shape"]["block_size"] == r["shape"]["block_size"]]
        flex = [x["median_us"] for x in same if x["impl"] == "flex_paged" and x["median_us"]]
        s = r["shape"]
        lines.append(f"{str((s['batch'], s['seq_len'], s['q_heads'], s['kv_heads'], s['head_dim'], s['block_size'])):34s} "
                     f"{r['median_us']:8.1f} {sdpa:8.1f} {sdpa / r['median_us']:6.2f} "
                     f"{gather[0] if gather else math.nan:7.0f} {flex[0] if flex else math.nan:7.0f} "
                     f"{r['gbps']:6.0f}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
