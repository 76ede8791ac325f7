"""Offline throughput: minipaged's engine against transformers, on the same random Qwen3-0.6B-shaped model.

    python benchmarks/bench_engine.py --out DIR [--quick] [--max-seconds S] [--paths a,b,c]

Workload (the course's benchmark): 256 requests, prompt lengths uniform in 100-1024 tokens, 512 new
tokens each, EOS ignored, greedy. Paths, measured in one process on one model:

- ``minipaged``: chapter 12's ``minipaged.engine.llm_engine.LLMEngine(model).generate(...)`` (the book's
  ``minipaged.LLM`` is measured by bench_fast_engine.py)
- ``hf_generate_batch``: transformers' continuous batching, ``model.generate_batch`` with
  ``attn_implementation="paged|sdpa"``
- ``hf_generate_padded``: ``model.generate`` on left-padded batches of 64

Writes DIR/engine.json: {"device", "date", "command", "rows": [...]}, one row per path with output
tokens/s, and for minipaged the roofline fraction (bytes of weights plus KV read per step over the
measured copy bandwidth). The transformers paths are slow, so by default they run on a prefix of the
workload: ``--hf-requests`` (64) for ``generate_batch``, and padded ``generate`` stops after the batch
that passes ``--max-seconds`` (30); each row records how many requests it ran. The full comparison:
``--hf-requests 256 --max-seconds 1000`` (about 6 minutes). The JSON is rewritten after every path.
``--check`` first verifies greedy parity with transformers (fp32, 4 layers) with and without CUDA
graphs and under preemption; ``--output-lens uniform`` runs nano-vllm's workload (minipaged only).

On a GPU every path (and the parity check) runs in a process of its own, on the same seeded model, so
that no path runs in memory another left behind (``--in-process`` turns this off). Each row records
the free device memory when the path started and its peak; the minipaged row also records what
device memory stayed allocated after the engine was deleted (``leaked_bytes``), and what stays once
PyTorch's cached cuBLAS workspaces are cleared too (should be 0).
``hf_generate_padded_no_cudnn`` and ``hf_generate_batch_no_cudnn`` keep SDPA off cuDNN's attention,
which plans anew for every new key length (chapter 9).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
import json
import random
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import minipaged.runtime  # noqa: E402,F401  (before triton: the interpreter switch on CPU)
from minipaged.memory.sizing import kv_bytes_per_token  # noqa: E402

COPY_BANDWIDTH = 4.29e12  # bytes/s read+written, measured device-to-device copy on this H200


def qwen3_06b_config(quick: bool):
    from transformers import Qwen3Config

    if quick and not torch.cuda.is_available():
        return Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                           max_position_embeddings=4096, tie_word_embeddings=False)
    return Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                       max_position_embeddings=40960, tie_word_embeddings=True)


def build_model(config, device, dtype):
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(config)
    return model.to(dtype).eval()


def workload(num_requests: int, lo: int, hi: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(lo, hi))] for _ in range(num_requests)]


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def memory_row() -> dict:
    """Free device memory now and the peak this process allocated so far (GiB)."""
    if not torch.cuda.is_available():
        return {}
    free, total = torch.cuda.mem_get_info()
    return {"free_gib_at_start": round(free / 2**30, 2), "total_gib": round(total / 2**30, 2)}


def run_minipaged(model, prompts, max_tokens, args):
    from minipaged import SamplingParams
    from minipaged.engine.llm_engine import LLMEngine  # chapter 12's engine: bench_fast_engine.py measures minipaged.LLM

    allocated_before = torch.cuda.memory_allocated() if torch.cuda.is_available() else 0
    llm = LLMEngine(model, block_size=16, max_num_seqs=args.max_num_seqs)
    if args.output_lens == "uniform":  # nano-vllm's workload: output lengths uniform in 100-1024
        rng = random.Random(1)
        params = [SamplingParams(temperature=0.0, max_tokens=rng.randint(100, 1024), ignore_eos=True)
                  for _ in prompts]
    else:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate([[1 + i] * 32 for i in range(4)], SamplingParams(temperature=0.0, max_tokens=4),
                 use_tqdm=False)  # warm-up: kernels compiled, graphs captured
    sync()
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    sync()
    seconds = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    row = {"path": "minipaged", "requests": len(prompts), "output_tokens": tokens,
           "seconds": seconds, "tok_per_s": tokens / seconds}
    stats = llm.last_run_stats()
    row.update(stats)
    row.update(roofline(model.config, llm, stats, seconds))
    row["num_blocks"] = llm.cache.num_blocks
    del llm, outputs
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        row["leaked_bytes"] = torch.cuda.memory_allocated() - allocated_before
        # cuBLAS keeps one workspace per stream it ran on (graph capture runs on a side stream) for
        # the life of the process; they are PyTorch's, not the engine's
        torch._C._cuda_clearCublasWorkspaces()
        row["leaked_bytes_without_cublas_workspaces"] = torch.cuda.memory_allocated() - allocated_before
    return row


def roofline(config, llm, stats, seconds):
    """Lower bound on time: every step reads all weights once plus the KV of every running token.

    ``llm``: an ``LLMEngine`` or the ``minipaged.LLM`` front end (both have ``model`` and ``cache``)."""
    weight_bytes = sum(p.numel() * p.element_size() for p in llm.model.parameters())
    kv_per_token = kv_bytes_per_token(config.num_hidden_layers, config.num_key_value_heads,
                                      config.head_dim, llm.cache.storage.element_size())
    steps = stats.get("steps", 0)
    kv_tokens_read = stats.get("kv_tokens_read", 0)
    ideal = (steps * weight_bytes + kv_tokens_read * kv_per_token) / COPY_BANDWIDTH
    return {"roofline_seconds": ideal, "roofline_fraction": ideal / seconds if seconds else None,
            "weight_bytes": weight_bytes}


def set_attention(model, name):
    try:
        model.set_attn_implementation(name)
    except (AttributeError, ValueError):  # older transformers: the config field decides
        model.config._attn_implementation = name


def check_parity(device) -> dict:
    """Greedy minipaged (chapter 12's ``LLMEngine``) == transformers generate(do_sample=False),
    fp32, before any timing."""
    from minipaged import SamplingParams
    from minipaged.engine.llm_engine import LLMEngine
    from minipaged.model.qwen3 import qwen3_0_6b_config, random_qwen3, reference_greedy

    config = qwen3_0_6b_config(tie_word_embeddings=False, initializer_range=0.2, num_hidden_layers=4)
    hf = random_qwen3(config, dtype=torch.float32, device=device, attn_implementation="sdpa")
    rng = random.Random(1)
    prompts = [[rng.randrange(config.vocab_size) for _ in range(n)] for n in (5, 17, 100, 333, 2, 64)]
    reference, _ = reference_greedy(hf, prompts, 24)
    rows = {}
    for name, kw in (("graphs", {}), ("eager", {"enable_cuda_graphs": False}),
                     ("preempt_recompute", {"num_blocks": 120, "block_size": 4}),
                     ("preempt_swap", {"num_blocks": 120, "block_size": 4, "preemption_mode": "swap"})):
        llm = LLMEngine(hf, num_blocks=kw.pop("num_blocks", 4096), check_invariants=True, **kw)
        got = [o.outputs[0].token_ids for o in llm.generate(
            prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)]
        rows[name] = {"identical": got == reference,
                      "first_diff": [i for i, (a, b) in enumerate(zip(got, reference)) if a != b],
                      **{k: llm.last_run_stats()[k] for k in ("preemptions", "graph_steps")}}
        del llm
    del hf
    torch.cuda.empty_cache()
    return rows


@contextlib.contextmanager
def sdpa_backends(no_cudnn: bool):
    """Torch's default SDPA backends, or all but cuDNN's attention (a process-wide switch, so it also
    holds in the worker thread of ``generate_batch``)."""
    before = torch.backends.cuda.cudnn_sdp_enabled()
    if no_cudnn:
        torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        yield "flash, efficient, math (no cuDNN)" if no_cudnn else "torch default"
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


def run_hf_generate_batch(model, prompts, max_tokens, args, no_cudnn=False):
    with sdpa_backends(no_cudnn) as backends:
        row = _hf_generate_batch(model, prompts, max_tokens)
    row.update(path="hf_generate_batch_no_cudnn" if no_cudnn else "hf_generate_batch", sdpa_backends=backends)
    return row


def _hf_generate_batch(model, prompts, max_tokens):
    from transformers import GenerationConfig

    set_attention(model, "paged|sdpa")
    config = GenerationConfig(max_new_tokens=max_tokens, do_sample=False, eos_token_id=-1,
                              pad_token_id=0, use_cuda_graph=False)
    model.generate_batch(inputs=[p[:32] for p in prompts[:4]],
                         generation_config=GenerationConfig(max_new_tokens=4, do_sample=False,
                                                            eos_token_id=-1, pad_token_id=0))
    sync()
    start = time.perf_counter()
    results = model.generate_batch(inputs=prompts, generation_config=config)
    sync()
    seconds = time.perf_counter() - start
    set_attention(model, "sdpa")
    tokens = sum(len(r.generated_tokens) for r in results.values())
    return {"path": "hf_generate_batch", "requests": len(prompts), "output_tokens": tokens,
            "seconds": seconds, "tok_per_s": tokens / seconds, "attn_implementation": "paged|sdpa"}


def padded_generate(model, batch, max_tokens):
    """``model.generate`` on one left-padded batch; returns the number of new tokens per row."""
    device = next(model.parameters()).device
    width = max(map(len, batch))
    ids = torch.zeros((len(batch), width), dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, p in enumerate(batch):  # left padding
        ids[row, width - len(p):] = torch.tensor(p)
        mask[row, width - len(p):] = 1
    out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                         max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    return out.shape[1] - width


def run_hf_padded(model, prompts, max_tokens, args, deadline, no_cudnn=False):
    set_attention(model, "sdpa")
    tokens, seconds, done = 0, 0.0, 0
    with sdpa_backends(no_cudnn) as backends:
        padded_generate(model, [p[:32] for p in prompts[:4]], 4)  # warm-up
        for i in range(0, len(prompts), args.hf_batch):
            batch = prompts[i:i + args.hf_batch]
            sync()
            start = time.perf_counter()
            new_tokens = padded_generate(model, batch, max_tokens)
            sync()
            seconds += time.perf_counter() - start
            tokens += new_tokens * len(batch)
            done += len(batch)
            if time.monotonic() > deadline:
                break
    return {"path": "hf_generate_padded_no_cudnn" if no_cudnn else "hf_generate_padded",
            "requests": done, "output_tokens": tokens, "seconds": seconds,
            "tok_per_s": tokens / seconds, "batch_size": args.hf_batch,
            "sdpa_backends": backends}


PATHS = ("minipaged", "hf_generate_batch", "hf_generate_batch_no_cudnn", "hf_generate_padded",
         "hf_generate_padded_no_cudnn")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results", help="folder for engine.json")
    parser.add_argument("--quick", action="store_true", help="a small workload (and tiny model on CPU)")
    parser.add_argument("--max-seconds", type=float, default=30.0,
                        help="padded generate stops after the batch that passes this many seconds")
    parser.add_argument("--paths", default="minipaged,hf_generate_batch,hf_generate_padded",
                        help="comma-separated, from: " + ", ".join(PATHS))
    parser.add_argument("--num-requests", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--hf-requests", type=int, default=64,
                        help="requests for generate_batch, a prefix of the workload (it returns only "
                             "at the end; all 256 take about 3 minutes on an H200)")
    parser.add_argument("--hf-batch", type=int, default=64)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--output-lens", choices=["fixed", "uniform"], default="fixed",
                        help="uniform: nano-vllm's workload, output lengths uniform in 100-1024 "
                             "(minipaged path only)")
    parser.add_argument("--check", action="store_true",
                        help="first check greedy parity with transformers (fp32, 4 layers)")
    parser.add_argument("--in-process", action="store_true",
                        help="run every path in this process (the default on CPU)")
    parser.add_argument("--row-file", help=argparse.SUPPRESS)  # a child process writes its row here
    args = parser.parse_args(argv)
    unknown = set(args.paths.split(",")) - set(PATHS)
    if unknown:
        parser.error(f"unknown path(s) {sorted(unknown)}; choose from {', '.join(PATHS)}")
    return args


def workload_spec(args, device):
    num_requests = args.num_requests or (32 if args.quick else 256)
    max_tokens = args.max_tokens or (64 if args.quick else 512)
    lo, hi = (16, 128) if args.quick and device == "cpu" else (100, 1024)
    return num_requests, max_tokens, lo, hi


def run_path(path, args, device) -> dict:
    """Build the seeded model and run one path on it (in this process)."""
    if path == "parity":
        return check_parity(device)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    num_requests, max_tokens, lo, hi = workload_spec(args, device)
    config = qwen3_06b_config(args.quick)
    model = build_model(config, device, dtype)
    prompts = workload(num_requests, lo, hi, config.vocab_size)
    memory = memory_row()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    deadline = time.monotonic() + args.max_seconds
    if path == "minipaged":
        row = run_minipaged(model, prompts, max_tokens, args)
    elif path.startswith("hf_generate_batch"):
        row = run_hf_generate_batch(model, prompts[:args.hf_requests], max_tokens, args,
                                    no_cudnn=path.endswith("no_cudnn"))
    else:
        row = run_hf_padded(model, prompts, max_tokens, args, deadline,
                            no_cudnn=path == "hf_generate_padded_no_cudnn")
    row.update(memory)
    if device == "cuda":
        row["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return row


def run_in_child(path, args) -> dict:
    """Run one path in a fresh Python process; its row comes back through a file."""
    with tempfile.TemporaryDirectory() as tmp:
        row_file = Path(tmp) / "row.json"
        command = [sys.executable, __file__, "--in-process", "--paths", path if path != "parity" else "minipaged",
                   "--row-file", str(row_file), "--out", tmp, "--max-seconds", str(args.max_seconds),
                   "--hf-requests", str(args.hf_requests), "--hf-batch", str(args.hf_batch),
                   "--max-num-seqs", str(args.max_num_seqs), "--output-lens", args.output_lens]
        command += ["--quick"] * args.quick + ["--check"] * (path == "parity")
        for flag, value in (("--num-requests", args.num_requests), ("--max-tokens", args.max_tokens)):
            if value is not None:
                command += [flag, str(value)]
        done = subprocess.run(command)
        if row_file.exists():
            return json.loads(row_file.read_text())
        return {"path": path, "error": f"child process exited with {done.returncode} and wrote no row"}


def main(argv=None) -> int:
    args = parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    in_process = args.in_process or device == "cpu"

    if args.row_file:  # a child: one path (or the parity check), one row
        path = "parity" if args.check else args.paths
        try:
            row = run_path(path, args, device)
        except Exception as error:  # recorded; the parent goes on with the other paths
            traceback.print_exc()
            row = {"path": path, "error": f"{type(error).__name__}: {error}"}
        Path(args.row_file).write_text(json.dumps(row))
        return 0

    num_requests, max_tokens, lo, hi = workload_spec(args, device)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = qwen3_06b_config(args.quick)
    result = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join(sys.argv),
        "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__},
        "workload": {"requests": num_requests, "prompt_len": [lo, hi], "max_tokens": max_tokens,
                     "ignore_eos": True, "greedy": True,
                     "dtype": str(torch.bfloat16 if device == "cuda" else torch.float32),
                     "model": "random Qwen3-0.6B shape" if config.num_hidden_layers == 28 else "tiny"},
        "isolation": "in one process" if in_process else "one process per path",
        "copy_bandwidth_bytes_per_s": COPY_BANDWIDTH,
        "parity_fp32_4_layers": None,
        "rows": [],
    }

    def save():
        (out_dir / "engine.json").write_text(json.dumps(result, indent=1))

    if args.check and device == "cuda":
        parity = run_path("parity", args, device) if in_process else run_in_child("parity", args)
        result["parity_fp32_4_layers"] = parity
        print("parity:", json.dumps(parity), flush=True)
        save()

    paths = args.paths.split(",")
    if args.output_lens == "uniform":
        paths = [p for p in paths if p == "minipaged"]
        result["workload"]["max_tokens"] = "uniform 100-1024"
    for path in paths:
        t0 = time.perf_counter()
        if in_process:
            try:
                row = run_path(path, args, device)
            except Exception as error:  # a failing path is recorded, the others still run
                traceback.print_exc()
                row = {"path": path, "error": f"{type(error).__name__}: {error}"}
        else:
            row = run_in_child(path, args)
        row["wall_seconds"] = time.perf_counter() - t0
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
        save()
    return 0 if all("error" not in r for r in result["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
