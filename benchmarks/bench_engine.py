"""Offline throughput: minipaged's LLM against transformers, on the same random Qwen3-0.6B-shaped model.

    python benchmarks/bench_engine.py --out DIR [--quick] [--max-seconds S] [--paths a,b,c]

Workload (the course's benchmark): 256 requests, prompt lengths uniform in 100-1024 tokens, 512 new
tokens each, EOS ignored, greedy. Paths, measured in one process on one model:

- ``minipaged``: ``minipaged.LLM(model).generate(...)``
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
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import random
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import minipaged.runtime  # noqa: E402,F401  (before triton: the interpreter switch on CPU)
from minipaged.sizing import kv_bytes_per_token  # noqa: E402

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


def run_minipaged(model, prompts, max_tokens, args):
    from minipaged import LLM, SamplingParams

    llm = LLM(model, block_size=16, max_num_seqs=args.max_num_seqs)
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
    return row


def roofline(config, llm, stats, seconds):
    """Lower bound on time: every step reads all weights once plus the KV of every running token."""
    weight_bytes = sum(p.numel() * p.element_size() for p in llm.model_parameters())
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
    """Greedy minipaged == transformers generate(do_sample=False), fp32, before any timing."""
    from minipaged import LLM, SamplingParams
    from minipaged.qwen3 import qwen3_0_6b_config, random_qwen3, reference_greedy

    config = qwen3_0_6b_config(tie_word_embeddings=False, initializer_range=0.2, num_hidden_layers=4)
    hf = random_qwen3(config, dtype=torch.float32, device=device, attn_implementation="sdpa")
    rng = random.Random(1)
    prompts = [[rng.randrange(config.vocab_size) for _ in range(n)] for n in (5, 17, 100, 333, 2, 64)]
    reference, _ = reference_greedy(hf, prompts, 24)
    rows = {}
    for name, kw in (("graphs", {}), ("eager", {"enable_cuda_graphs": False}),
                     ("preempt_recompute", {"num_blocks": 120, "block_size": 4}),
                     ("preempt_swap", {"num_blocks": 120, "block_size": 4, "preemption_mode": "swap"})):
        llm = LLM(hf, num_blocks=kw.pop("num_blocks", 4096), check_invariants=True, **kw)
        got = [o.outputs[0].token_ids for o in llm.generate(
            prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)]
        rows[name] = {"identical": got == reference,
                      "first_diff": [i for i, (a, b) in enumerate(zip(got, reference)) if a != b],
                      **{k: llm.last_run_stats()[k] for k in ("preemptions", "graph_steps")}}
        del llm
    del hf
    torch.cuda.empty_cache()
    return rows


def run_hf_generate_batch(model, prompts, max_tokens, args):
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


def run_hf_padded(model, prompts, max_tokens, args, deadline):
    set_attention(model, "sdpa")
    device = next(model.parameters()).device
    tokens, seconds, done = 0, 0.0, 0
    for i in range(0, len(prompts), args.hf_batch):
        batch = prompts[i:i + args.hf_batch]
        width = max(map(len, batch))
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, p in enumerate(batch):  # left padding
            ids[row, width - len(p):] = torch.tensor(p)
            mask[row, width - len(p):] = 1
        sync()
        start = time.perf_counter()
        out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                             max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
        sync()
        seconds += time.perf_counter() - start
        tokens += (out.shape[1] - width) * len(batch)
        done += len(batch)
        if time.monotonic() > deadline:
            break
    return {"path": "hf_generate_padded", "requests": done, "output_tokens": tokens,
            "seconds": seconds, "tok_per_s": tokens / seconds, "batch_size": args.hf_batch}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results", help="folder for engine.json")
    parser.add_argument("--quick", action="store_true", help="a small workload (and tiny model on CPU)")
    parser.add_argument("--max-seconds", type=float, default=30.0,
                        help="padded generate stops after the batch that passes this many seconds")
    parser.add_argument("--paths", default="minipaged,hf_generate_batch,hf_generate_padded")
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
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    parity = None
    if args.check and device == "cuda":
        try:
            parity = check_parity(device)
        except Exception as error:  # recorded; the timing still runs
            traceback.print_exc()
            parity = {"error": f"{type(error).__name__}: {error}"}
            torch.cuda.empty_cache()
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    num_requests = args.num_requests or (32 if args.quick else 256)
    max_tokens = args.max_tokens or (64 if args.quick else 512)
    lo, hi = (16, 128) if args.quick and device == "cpu" else (100, 1024)
    config = qwen3_06b_config(args.quick)
    model = build_model(config, device, dtype)
    if parity is not None:
        print("parity:", json.dumps(parity), flush=True)
    prompts = workload(num_requests, lo, hi, config.vocab_size)

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join(sys.argv),
        "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__},
        "workload": {"requests": num_requests, "prompt_len": [lo, hi], "max_tokens": max_tokens,
                     "ignore_eos": True, "greedy": True, "dtype": str(dtype),
                     "model": "random Qwen3-0.6B shape" if config.num_hidden_layers == 28 else "tiny"},
        "copy_bandwidth_bytes_per_s": COPY_BANDWIDTH,
        "parity_fp32_4_layers": parity,
        "rows": [],
    }

    def save():
        (out_dir / "engine.json").write_text(json.dumps(result, indent=1))

    paths = args.paths.split(",")
    if args.output_lens == "uniform":
        paths = [p for p in paths if p == "minipaged"]
        result["workload"]["max_tokens"] = "uniform 100-1024"
    for path in paths:
        deadline = time.monotonic() + args.max_seconds
        t0 = time.perf_counter()
        try:
            if path == "minipaged":
                row = run_minipaged(model, prompts, max_tokens, args)
            elif path == "hf_generate_batch":
                row = run_hf_generate_batch(model, prompts[:args.hf_requests], max_tokens, args)
            elif path == "hf_generate_padded":
                row = run_hf_padded(model, prompts, max_tokens, args, deadline)
            else:
                raise SystemExit(f"unknown path {path!r}")
        except Exception as error:  # a failing path is recorded, the others still run
            traceback.print_exc()
            row = {"path": path, "error": f"{type(error).__name__}: {error}"}
            if device == "cuda":
                torch.cuda.empty_cache()
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
