"""Chapter 0: the one switch between CPU and GPU, and where recorded measurements are found."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from minipaged.runtime import (by_device, default_device, has_gpu, results_path,
                               uses_triton_interpreter)


def test_device_follows_torch():
    assert has_gpu() == torch.cuda.is_available()
    assert default_device().type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert by_device(cpu=1, gpu=2) == (2 if has_gpu() else 1)


def test_interpreter_reads_the_environment_when_asked(monkeypatch):
    for value, expected in (("1", True), ("0", False), ("", False)):
        monkeypatch.setenv("TRITON_INTERPRET", value)
        assert uses_triton_interpreter() is expected
    monkeypatch.delenv("TRITON_INTERPRET")
    assert uses_triton_interpreter() is False


def test_results_path_finds_the_repository_copy_from_anywhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                       # not the repository root
    path = results_path("gpu_status.json")
    assert path.is_absolute() and path.exists()
    runs = json.loads(path.read_text())["chapters"].values()
    assert runs and all({"device", "date", "command"} <= run.keys() for run in runs)
    missing = results_path("no_such_run.json")        # not recorded: the notebook-relative fallback
    assert str(missing) == "results/no_such_run.json" and not missing.exists()


# -- import order on a machine without a GPU (chapter 0, "When Triton was imported first") -------

ROOT = Path(__file__).resolve().parent.parent

KERNEL_CALLS = """
import torch, triton, triton.language as tl
from minipaged.kernels.kv_cache import PagedKVCache

@triton.jit
def shift(x_ptr, N: tl.constexpr):  # tl.max, tl.cdiv, tl.sum and the method form x.max()
    x = tl.load(x_ptr + tl.arange(0, N))
    tl.store(x_ptr + tl.arange(0, N), x - tl.max(x, 0) + x.max(0) + tl.cdiv(N, 3) - tl.sum(x, 0))

x = torch.arange(4.0)
shift[(1,)](x, 4)
assert x.tolist() == [-4.0, -3.0, -2.0, -1.0], x
cache = PagedKVCache(1, 2, 2, 1, 4, torch.float32, "cpu")   # the paged write kernel, tiny
key = torch.randn(1, 1, 4)
cache.write(0, key, -key, torch.tensor([3]))
assert torch.equal(cache.key_cache(0).reshape(-1, 4)[3], key[0, 0])
print("kernels ok")
"""

STRUCTURE = """
import json, sys
import triton.language as tl
from triton.runtime.jit import JITFunction
from triton.runtime.interpreter import InterpretedFunction
kinds = (JITFunction, InterpretedFunction)
found = {name: {a: type(v).__name__ for a, v in vars(m).items() if isinstance(v, kinds)}
         for name, m in sys.modules.items()
         if m is not None and (name + ".").startswith("triton.language.")}
found["tensor"] = {a: type(v).__name__ for a, v in vars(tl.tensor).items()
                   if callable(v) or isinstance(v, kinds)}
print(json.dumps(found, sort_keys=True))
"""


def run_cpu_python(code: str, interpret: str | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter that sees no GPU, TRITON_INTERPRET unset unless given."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT))
    if interpret is not None:
        env["TRITON_INTERPRET"] = interpret
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)


@pytest.mark.parametrize("imports", [
    "import minipaged\nfrom transformers import Qwen3ForCausalLM",
    "from transformers import Qwen3ForCausalLM\nimport minipaged",   # the order readers type
], ids=["minipaged-first", "transformers-first"])
def test_kernels_run_on_cpu_in_either_import_order(imports):
    done = run_cpu_python(imports + "\n" + KERNEL_CALLS)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("kernels ok")


def test_late_switch_leaves_triton_as_a_clean_interpreted_import_would():
    late = run_cpu_python("import triton.language\nimport minipaged\n" + STRUCTURE)
    clean = run_cpu_python("import triton.language\n" + STRUCTURE, interpret="1")
    assert late.returncode == 0 and clean.returncode == 0, late.stderr[-3000:] + clean.stderr[-3000:]
    late_kinds, clean_kinds = json.loads(late.stdout), json.loads(clean.stdout)
    assert "InterpretedFunction" in json.dumps(clean_kinds)        # the comparison is not vacuous
    assert late_kinds == clean_kinds


def test_an_unrepairable_triton_fails_at_import_with_one_typed_line():
    sabotage = ("import triton.language.core as core\n"
                "del core._tensor_member_fn   # a Triton whose internals this repair does not know\n"
                "try:\n"
                "    import minipaged\n"
                "except Exception as error:\n"
                "    print(type(error).__name__, '|', error)\n")
    done = run_cpu_python(sabotage)
    assert done.returncode == 0, done.stderr[-3000:]
    kind, _, message = done.stdout.strip().partition(" | ")
    assert kind == "TritonImportOrderError" and "\n" not in message
    assert "import minipaged` first" in message and "TRITON_INTERPRET=1" in message
