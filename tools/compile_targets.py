"""Compile every Triton kernel of minipaged for GPUs that are not present: sm75 (T4), sm80 (A100),
sm89 (L4).

Triton compiles for any target it knows, present or not. This script records the kernels'
specializations (signature and constants) while it calls every kernel once through the package's
public API on the card that is here (each cache dtype, head dims 64 and 128, decode attention with
and without split-KV, chapter 13's FP8 cache, chapter 14's fused kernels, chapter 15's paged prefill), then
compiles each of them again for the readers' cards and writes what happened as JSON. Kernels on
e4m3 data (chapter 13's, and any specialization that takes an e4m3 pointer, such as chapter 15's
prefill on chapter 13's cache) are compiled for sm89 only: earlier cards have no FP8, and chapter 13
says so.

    python tools/compile_targets.py --out DIR        (on a machine with an NVIDIA GPU)
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGETS = {"sm75": 75, "sm80": 80, "sm89": 89}
USER_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
REAL_COMPILE = None  # Triton's own compile, kept when record_specializations wraps it


def find_kernels() -> dict:
    """Every ``@triton.jit`` function defined in a module of the package, by ``module.name``."""
    from triton.runtime.jit import JITFunction

    import minipaged

    found = {}
    for info in pkgutil.walk_packages(minipaged.__path__, "minipaged."):
        if info.ispkg or info.name == "minipaged.__main__":
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            while not isinstance(obj, JITFunction) and hasattr(obj, "fn"):  # autotune wrappers
                obj = obj.fn
            if isinstance(obj, JITFunction) and obj.__module__ == module.__name__:
                found[f"{info.name.removeprefix('minipaged.')}.{name}"] = obj
    return found


def record_specializations(kernels: dict) -> dict[str, dict]:
    """Wrap Triton's compile step so every (source, options) compiled for a kernel is kept.

    The JIT binds ``compile`` when a kernel first runs, so this must run before any kernel does.
    """
    import triton
    import triton.runtime.jit as jit_module

    seen: dict[str, dict] = {name: {} for name in kernels}
    names = {id(kernel): name for name, kernel in kernels.items()}

    def wrap(real):
        def compile_and_record(src, *args, **kwargs):
            name = names.get(id(getattr(src, "fn", None)))
            if name is not None:
                options = kwargs.get("options") or {}
                user = {k: options[k] for k in USER_OPTIONS if k in options}
                seen[name].setdefault(src.hash(), (src, user))
            return real(src, *args, **kwargs)
        return compile_and_record

    # The JIT binds ``compile`` when a kernel first runs (``from ..compiler import compile``), so
    # wrapping it where it is imported from, before any kernel runs, catches every release.
    import triton.compiler as compiler_package
    import triton.compiler.compiler as compiler_module

    global REAL_COMPILE
    REAL_COMPILE = compiler_module.compile
    wrapped = wrap(REAL_COMPILE)
    for holder in (compiler_module, compiler_package, triton, jit_module):
        if hasattr(holder, "compile"):
            holder.compile = wrapped
    for kernel in kernels.values():
        if "compile" in vars(kernel):
            kernel.compile = wrapped
    return seen


def exercise_kernels() -> None:
    """Call every kernel once per dtype and head size on the GPU here (small sizes)."""
    import torch

    from minipaged.kernels import decode_attention
    from minipaged.kernels.decode_attention import paged_attention
    from minipaged.kernels.kv_cache import PagedKVCache

    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for head_dim in (64, 128):
            cache = PagedKVCache(1, 80, 16, 2, head_dim, dtype=dtype, device="cuda")
            tokens = 1000
            key = torch.randn(tokens, 2, head_dim, device="cuda", dtype=dtype)
            cache.write(0, key, torch.randn_like(key), torch.arange(tokens, device="cuda"))
            cache.copy_blocks([(0, 70)])
            query = torch.randn(2, 8, head_dim, device="cuda", dtype=dtype)
            tables = torch.arange(64, device="cuda", dtype=torch.int32).repeat(2, 1)
            lens = torch.tensor([tokens, 37], device="cuda", dtype=torch.int32)
            for splits in (1, 4):
                paged_attention(query, cache, 0, tables, lens, num_splits=splits)
            teaching = getattr(decode_attention, "_paged_attention_v1", None)
            if teaching is not None:  # chapter 8's version 1
                teaching(query, cache, 0, tables, lens)
            exercise_fast_kernels(dtype, head_dim)
            exercise_fp8_cache(dtype, head_dim)
    torch.cuda.synchronize()


FP8_MODULES = ("fp8_kv_cache.",)  # kernels on e4m3 data: compiled only for sm89 and later
FP8_MIN_ARCH = 89


def reads_e4m3(src) -> bool:
    """Whether a specialization takes an e4m3 pointer (Triton's ``*fp8e4nv``)."""
    return any("fp8" in str(kind) for kind in getattr(src, "signature", {}).values())


def exercise_fp8_cache(dtype, head_dim: int) -> None:
    """Chapter 13's write, decode and copy kernels, when the package and the card have FP8."""
    import torch

    try:
        from minipaged.kernels.fp8_kv_cache import Fp8PagedKVCache, fp8_supported
    except ImportError:
        return
    if not fp8_supported("cuda"):
        return
    cache = Fp8PagedKVCache(1, 80, 16, 2, head_dim, device="cuda")
    tokens = 1000
    key = torch.randn(tokens, 2, head_dim, device="cuda", dtype=dtype)
    cache.write(0, key, torch.randn_like(key), torch.arange(tokens, device="cuda"))
    cache.copy_blocks([(0, 70)])
    cache.gather(0, list(range(3)), 40)
    query = torch.randn(2, 8, head_dim, device="cuda", dtype=dtype)
    tables = torch.arange(64, device="cuda", dtype=torch.int32).repeat(2, 1)
    lens = torch.tensor([tokens, 37], device="cuda", dtype=torch.int32)
    for splits in (1, 4):
        cache.paged_attention(query, 0, tables, lens, num_splits=splits)
    try:
        from minipaged.kernels.prefill_attention import paged_prefill_attention
        from minipaged.model.qwen3 import ForwardBatch
    except ImportError:
        return
    batch = ForwardBatch.from_sequences([[0] * 20, [0] * 3], [0, 10], [[0, 1], [2]], 16, "cuda")
    paged_prefill_attention(torch.randn(23, 8, head_dim, device="cuda", dtype=dtype),
                            cache, 0, batch, head_dim ** -0.5)


def exercise_fast_kernels(dtype, head_dim: int) -> None:
    """Chapter 14's fused kernels and chapter 15's paged prefill, when the package has them."""
    import torch

    try:
        from minipaged.kernels import fused_ops
        from minipaged.kernels.prefill_attention import paged_prefill_attention
    except ImportError:
        return
    from minipaged.kernels.kv_cache import PagedKVCache
    from minipaged.model.qwen3 import ForwardBatch, rope_cos_sin, rope_inv_freq

    def rand(*shape):
        return torch.randn(*shape, device="cuda", dtype=dtype)

    x, ones = rand(5, 96), torch.ones(96, device="cuda", dtype=dtype)
    fused_ops.add_rms_norm(x, None, ones, 1e-6)
    fused_ops.add_rms_norm(x, rand(5, 96), ones, 1e-6)
    gain = torch.ones(head_dim, device="cuda", dtype=dtype)
    cos, sin = rope_cos_sin(torch.arange(5, device="cuda"), rope_inv_freq(head_dim, 1e4), dtype)
    fused_ops.qk_norm_rope(rand(5, 12 * head_dim), 8, 2, gain, gain, cos, sin, 1e-6)
    fused_ops.silu_mul(rand(5, 192))
    cache = PagedKVCache(1, 8, 16, 2, head_dim, dtype=dtype, device="cuda")
    batch = ForwardBatch.from_sequences([[0] * 20, [0] * 3], [0, 10], [[0, 1], [2]], 16, "cuda")
    paged_prefill_attention(rand(23, 8, head_dim), cache, 0, batch, head_dim ** -0.5)
    if head_dim == 128:  # logits in each dtype, once
        fused_ops.sample_fused(rand(3, 1000), torch.tensor([0.0, 1.0, 2.0], device="cuda"),
                     torch.arange(3, device="cuda"))


def inlined_helpers(kernels: dict) -> dict[str, str]:
    """``@triton.jit`` functions that are only called from other kernels (Triton inlines them, so
    they are compiled as part of their callers, never on their own): name -> a caller."""
    helpers = {}
    for name, kernel in kernels.items():
        callee = name.split(".")[-1]
        for other, caller in kernels.items():
            if other != name and f"{callee}(" in caller.src:
                helpers[name] = other
                break
    return helpers


def compile_for_targets(seen: dict[str, dict], helpers: dict[str, str]) -> dict[str, dict]:
    from triton.backends.compiler import GPUTarget

    report = {}
    for name, specializations in seen.items():
        if name in helpers and not specializations:
            report[name] = {"inlined into": helpers[name]}
            continue
        entry = {"specializations": len(specializations)}
        for label, arch in TARGETS.items():
            if name.startswith(FP8_MODULES) and arch < FP8_MIN_ARCH:
                entry[label] = "n/a: no FP8 before sm89"  # the chapter says so and skips
                continue
            errors, compiled = [], 0
            for src, options in specializations.values():
                if arch < FP8_MIN_ARCH and reads_e4m3(src):
                    continue  # e.g. chapter 15's prefill on chapter 13's cache
                compiled += 1
                try:
                    REAL_COMPILE(src, target=GPUTarget("cuda", arch, 32), options=options)
                except Exception as error:  # noqa: BLE001 - recorded, not hidden
                    errors.append(f"{type(error).__name__}: {str(error).splitlines()[0][:200]}")
            if specializations and not compiled:
                entry[label] = "n/a: every specialization reads e4m3, no FP8 before sm89"
            else:
                entry[label] = "ok" if specializations and not errors else (
                    "not exercised" if not specializations
                    else f"{len(errors)} failed: {errors[0]}")
        report[name] = entry
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".", help="folder for compile_targets.json")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch

    if not torch.cuda.is_available():
        print("compile_targets: no CUDA GPU here; the kernels run in Triton's interpreter, "
              "nothing to compile")
        return 0
    kernels = find_kernels()
    seen = record_specializations(kernels)
    exercise_kernels()
    report = {
        "device": torch.cuda.get_device_name(),
        "triton": __import__("triton").__version__,
        "kernels": compile_for_targets(seen, inlined_helpers(kernels)),
    }
    out = Path(args.out) / "compile_targets.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    for name, entry in report["kernels"].items():
        if "inlined into" in entry:
            print(f"{name:45s} inlined into {entry['inlined into']}")
            continue
        print(f"{name:45s} " + "  ".join(f"{t}={entry[t][:40]}" for t in TARGETS))
    failed = [n for n, e in report["kernels"].items()
              if "inlined into" not in e
              and any(e[t] != "ok" and not e[t].startswith("n/a") for t in TARGETS)]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
