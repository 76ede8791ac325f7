"""Chapter 13's accuracy measurements of the FP8 KV cache, recorded.

    python benchmarks/bench_fp8_accuracy.py --out DIR [--quick]

Writes DIR/fp8_accuracy_h200.json on a GPU (fp8_accuracy_cpu.json on a CPU): {"device", "date",
"command", "versions", "attention_sweep", "saturation", "bytes_per_token", "key_channels",
"end_to_end"}.

- ``attention_sweep``: ``minipaged.book.fp8_accuracy.accuracy_sweep``: for keys with outlier channels 1x
  to 16x the rest (synthetic, the structure trained models show), the attention-output error of
  every way of storing K/V (bf16, e4m3 with one scale of 1.0, e5m2 with none, one scale calibrated
  on 64 tokens, per (block, head) set by the first token, per (slot, head)) against fp32 K/V.
  ``saturation``: what the calibrated scale clips, per outlier size.
- ``bytes_per_token``: K and V of one token over all layers at Qwen3-0.6B's shape, per scheme.
- ``key_channels``: largest over median per-channel maximum of the keys a random Qwen3 writes in
  its first layer: how little structure a random model has.
- ``end_to_end``: teacher-forced decoding (``teacher_forced``) of a random Qwen3 (the tiny config
  in fp32 on a CPU; Qwen3-0.6B's shape in bf16 on a GPU) with the fp8 cache and with the model's
  own cache, each against transformers' logits: greedy-token agreement and logit distance.

Offline: random weights only. The real Qwen3-0.6B needs the hub; the chapter says how to run it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import minipaged.runtime  # noqa: E402,F401  (before triton: the interpreter switch on CPU)
from minipaged.memory.block_table import blocks_needed  # noqa: E402
from minipaged.kernels.fp8_kv_cache import (Fp8PagedKVCache, fp8_bytes_per_token,  # noqa: E402
                                            fp8_supported)
from minipaged.book.fp8_accuracy import (SCHEMES, accuracy_sweep, logit_agreement,  # noqa: E402
                                         teacher_forced)
from minipaged.model.qwen3 import (Qwen3PagedModel, qwen3_0_6b_config, random_qwen3,  # noqa: E402
                                   tiny_qwen3_config)
from minipaged.memory.sizing import kv_bytes_per_token  # noqa: E402

SHAPE = (28, 8, 128)                       # Qwen3-0.6B: layers, KV heads, head dim


def bytes_per_token() -> dict:
    layers, heads, dim = SHAPE
    bare = kv_bytes_per_token(layers, heads, dim, 1)
    rows = 2 * layers * heads
    per_scheme = {"fp32": kv_bytes_per_token(layers, heads, dim, 4),
                  "bf16": kv_bytes_per_token(layers, heads, dim, 2)}
    for name in SCHEMES:
        if name.startswith(("fp8", "e5m2")):
            per_scheme[name] = bare
    per_scheme["fp8, per (block, head)"] = bare + rows * 4 / 16
    per_scheme["fp8, per (slot, head)"] = fp8_bytes_per_token(layers, heads, dim)
    return per_scheme


def key_channels(hf_model, vocab: int, device) -> float:
    """Largest / median per-channel max of layer 0's keys, after QK-norm."""
    rng = random.Random(0)
    ids = torch.tensor([[rng.randrange(vocab) for _ in range(64)] for _ in range(8)])
    keys = []
    hook = hf_model.model.layers[0].self_attn.k_norm.register_forward_hook(
        lambda module, args, out: keys.append(out.detach()))
    with torch.no_grad():
        hf_model(ids.to(device))
    hook.remove()
    channel_max = keys[0].float().reshape(-1, keys[0].shape[-1]).abs().amax(0)
    return (channel_max.max() / channel_max.median()).item()


def end_to_end(hf_model, config, shape, device) -> dict:
    batch, prompt_len, steps = shape
    rng = random.Random(3)
    sequences = [[rng.randrange(config.vocab_size) for _ in range(prompt_len + steps)]
                 for _ in range(batch)]
    with torch.no_grad():
        reference = hf_model(torch.tensor(sequences, device=device)).logits
    reference = reference[:, prompt_len - 1:-1].float()
    paged = Qwen3PagedModel.from_hf(hf_model)
    num_blocks = batch * blocks_needed(prompt_len + steps, 16)
    caches = {"fp8": lambda: Fp8PagedKVCache(config.num_hidden_layers, num_blocks, 16,
                                             config.num_key_value_heads, config.head_dim,
                                             device),
              "auto": lambda: paged.new_cache(num_blocks, 16)}
    result = {"batch": batch, "prompt_len": prompt_len, "positions": batch * steps}
    for name, make in caches.items():
        with torch.no_grad():
            logits = teacher_forced(paged, make(), sequences, prompt_len)
        result[name] = logit_agreement(logits, reference)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results", help="folder for the JSON record")
    parser.add_argument("--quick", action="store_true", help="small sizes, to prove the script")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if not fp8_supported(device):
        print(f"{torch.cuda.get_device_name()} has no FP8 (compute capability < 8.9)")
        return 2
    rows, saturated = accuracy_sweep(outliers=(1, 4, 16) if args.quick else (1, 2, 4, 8, 16),
                                     tokens=256 if args.quick else 1024)
    for row in rows:
        print(" ".join(f"{k}={v:.4g}" for k, v in row.items()), flush=True)
    if cuda and not args.quick:
        config = qwen3_0_6b_config(tie_word_embeddings=False, initializer_range=0.2)
        dtype, shape = torch.bfloat16, (16, 128, 256)
    else:
        config, dtype = tiny_qwen3_config(), torch.float32
        shape = (2, 8, 8) if args.quick else (8, 16, 32)
    hf_model = random_qwen3(config, seed=0, dtype=dtype, device=device)
    result = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join(sys.argv),
        "versions": {"torch": torch.__version__, "triton": __import__("triton").__version__},
        "attention_sweep": rows,
        "saturation": {str(k): {"rows_share": share, "elements": count}
                       for k, (share, count) in saturated.items()},
        "bytes_per_token": bytes_per_token(),
        "key_channels": {"model": "random Qwen3, " + ("0.6B shape" if config.num_hidden_layers
                                                      == SHAPE[0] else "tiny config"),
                         "largest_over_median": key_channels(hf_model, config.vocab_size,
                                                             device)},
        "end_to_end": end_to_end(hf_model, config, shape, device),
    }
    print(json.dumps(result["end_to_end"]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"fp8_accuracy_{'h200' if cuda else 'cpu'}.json").write_text(
        json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
