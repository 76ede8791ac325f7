"""Qwen3 on the paged cache: bf16 parity with transformers, and greedy generation speed vs `generate`.

    python benchmarks/bench_qwen3_decode.py --out DIR            # Qwen3-0.6B shape, random bf16 weights
    python benchmarks/bench_qwen3_decode.py --out DIR --quick    # tiny model, runs anywhere (CPU too)

Writes DIR/qwen3_decode.json: {"device", "date", "command", "config", "parity", "rows"}. Each row is one
implementation at one batch size: ragged prompts (uniform lengths), greedy, EOS ignored; wall time of
the whole generation (prefill included) and, from a second run with one new token, the decode-only rate.
Both implementations use the same weights (ours shares transformers' tensors).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from minipaged.model.qwen3 import (ATTENTION_TOLERANCE, LOGITS_TOLERANCE,  # noqa: E402
                                   Qwen3PagedModel, attention_parity, greedy_generate,
                                   qwen3_0_6b_config, random_qwen3, reference_greedy,
                                   tiny_qwen3_config)
from minipaged.runtime import default_device  # noqa: E402


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def set_attention(hf_model, name: str) -> None:
    if hasattr(hf_model, "set_attn_implementation"):
        hf_model.set_attn_implementation(name)
    else:
        hf_model.config._attn_implementation = name


def parity(model, hf_model, prompts, new_tokens: int, dtype) -> dict:
    """The chapter's checks at this shape: per-layer attention, per-step logits, tokens."""
    set_attention(hf_model, "eager")
    layer_errors = attention_parity(model, hf_model, prompts, block_size=2)
    blocks = sum(-(-(len(p) + new_tokens) // 2) for p in prompts) + 8
    trace = greedy_generate(model, model.new_cache(blocks, 2), prompts, new_tokens,
                            arrivals=[0, 0, 2, 0, 5, 1][: len(prompts)])
    ref_tokens, ref_logits = reference_greedy(hf_model, prompts, new_tokens)
    per_prompt = []
    for mine_tokens, ref, mine_logits, logits in zip(trace.tokens, ref_tokens, trace.logits, ref_logits):
        s = next((i for i, (a, b) in enumerate(zip(mine_tokens, ref)) if a != b), new_tokens)
        upto = min(s + 1, new_tokens)
        err = ((torch.stack(mine_logits[:upto]) - logits[:upto]).abs().amax(-1)
               / logits[:upto].abs().amax(-1))
        row = {"prompt_len": None, "identical_tokens": s, "max_logits_error": err.max().item(),
               "distinct_reference_tokens": len(set(ref))}
        if s < new_tokens:
            top2 = logits[s].topk(2).values
            row["top2_gap_at_divergence"] = ((top2[0] - top2[1]) / logits[s].abs().max()).item()
            row["near_tie"] = row["top2_gap_at_divergence"] <= 2 * row["max_logits_error"]
        per_prompt.append(row)
    for row, p in zip(per_prompt, prompts):
        row["prompt_len"] = len(p)
    set_attention(hf_model, "sdpa")
    return {
        "dtype": str(dtype), "block_size": 2, "new_tokens": new_tokens,
        "attention_layer_errors": layer_errors,
        "attention_tolerance": ATTENTION_TOLERANCE[dtype], "logits_tolerance": LOGITS_TOLERANCE[dtype],
        "attention_ok": max(layer_errors) < ATTENTION_TOLERANCE[dtype],
        "logits_ok": all(r["max_logits_error"] < LOGITS_TOLERANCE[dtype] for r in per_prompt),
        "tokens_ok": all(r["identical_tokens"] == new_tokens or r.get("near_tie") for r in per_prompt),
        "decode_steps": trace.decode_steps, "mixed_steps": trace.mixed_steps,
        "prompts": per_prompt,
    }


def time_ours(model, prompts, new_tokens: int, block_size: int) -> float:
    blocks = sum(-(-(len(p) + new_tokens) // block_size) for p in prompts) + 1
    cache = model.new_cache(blocks, block_size)
    sync()
    start = time.perf_counter()
    greedy_generate(model, cache, prompts, new_tokens, keep_logits=False)
    sync()
    return time.perf_counter() - start


def time_transformers(hf_model, prompts, new_tokens: int) -> float:
    """Padded batch (left padding), contiguous cache: transformers' default `generate`."""
    width = max(len(p) for p in prompts)
    device = hf_model.device
    ids = torch.zeros(len(prompts), width, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = torch.tensor(p, device=device)
        mask[row, width - len(p):] = 1
    sync()
    start = time.perf_counter()
    with torch.inference_mode():
        hf_model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new_tokens,
                          min_new_tokens=new_tokens, pad_token_id=0)
    sync()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for qwen3_decode.json")
    parser.add_argument("--quick", action="store_true", help="tiny model and sizes (CPU smoke test)")
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--min-prompt", type=int, default=100)
    parser.add_argument("--max-prompt", type=int, default=512)
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args()

    device = default_device()
    gpu = device.type == "cuda"
    dtype = torch.bfloat16 if gpu else torch.float32
    if args.quick:
        config = tiny_qwen3_config()
        args.batches, args.new_tokens, args.min_prompt, args.max_prompt = [2, 4], 6, 3, 20
        parity_lengths, parity_tokens = [1, 2, 3, 9], 8
    else:
        config = qwen3_0_6b_config(tie_word_embeddings=False, initializer_range=0.2)
        parity_lengths, parity_tokens = [1, 2, 3, 17, 100, 257], 24
    hf_model = random_qwen3(config, seed=0, dtype=dtype, device=device, attn_implementation="sdpa")
    model = Qwen3PagedModel.from_hf(hf_model)
    rng = torch.Generator().manual_seed(0)
    result = {
        "device": torch.cuda.get_device_name() if gpu else "cpu",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__,
                     "triton": __import__("triton").__version__},
        "config": {"layers": config.num_hidden_layers, "hidden": config.hidden_size,
                   "heads": config.num_attention_heads, "kv_heads": config.num_key_value_heads,
                   "head_dim": config.head_dim, "vocab": config.vocab_size, "dtype": str(dtype),
                   "tied_embeddings": config.tie_word_embeddings, "weights": "random, seed 0"},
        "rows": [],
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "qwen3_decode.json"

    prompts = [torch.randint(0, config.vocab_size, (n,), generator=rng).tolist() for n in parity_lengths]
    t0 = time.perf_counter()
    result["parity"] = parity(model, hf_model, prompts, parity_tokens, dtype)
    result["parity"]["seconds"] = round(time.perf_counter() - t0, 2)
    print(json.dumps({k: v for k, v in result["parity"].items() if k != "prompts"}))
    path.write_text(json.dumps(result, indent=1))

    warm = [torch.randint(0, config.vocab_size, (n,), generator=rng).tolist() for n in (5, 9)]
    time_ours(model, warm, 3, args.block_size)       # compile the Triton kernels
    time_transformers(hf_model, warm, 3)
    for batch in args.batches:
        lengths = torch.randint(args.min_prompt, args.max_prompt + 1, (batch,), generator=rng).tolist()
        prompts = [torch.randint(0, config.vocab_size, (n,), generator=rng).tolist() for n in lengths]
        for impl, run in (("minipaged (paged, Triton decode)",
                           lambda n: time_ours(model, prompts, n, args.block_size)),
                          ("transformers generate (padded, sdpa)",
                           lambda n: time_transformers(hf_model, prompts, n))):
            total = run(args.new_tokens)
            first = run(1)
            row = {"impl": impl, "batch": batch, "prompt_lens": f"uniform {args.min_prompt}-{args.max_prompt}",
                   "mean_prompt_len": sum(lengths) / batch, "new_tokens": args.new_tokens,
                   "block_size": args.block_size if impl.startswith("minipaged") else None,
                   "seconds": round(total, 4), "tokens_per_s": batch * args.new_tokens / total,
                   "prefill_plus_one_token_s": round(first, 4),
                   "decode_tokens_per_s": batch * (args.new_tokens - 1) / max(total - first, 1e-9),
                   "decode_step_ms": 1e3 * (total - first) / (args.new_tokens - 1)}
            result["rows"].append(row)
            print(f"{impl:38s} B={batch:3d}: {row['tokens_per_s']:9.0f} tok/s end to end, "
                  f"{row['decode_tokens_per_s']:9.0f} tok/s decode ({row['decode_step_ms']:.1f} ms/step)")
            path.write_text(json.dumps(result, indent=1))
    print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
