"""The package where Triton is not installed (macOS, Windows: Triton has wheels for Linux only).

Each check runs a fresh interpreter in which `import triton` fails (``sys.modules["triton"] =
None``, which is what Python does for a module it cannot find): `import minipaged` works, an
`LLM` on the PyTorch backend generates the same greedy tokens as with Triton installed, and
asking for Triton (the backend, or a kernel) raises `TritonNotInstalledError`, which says
what to install, before the engine is built.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

BLOCK_TRITON = """
import sys
sys.modules["triton"] = None          # `import triton` now raises ImportError
sys.modules["triton.language"] = None
"""

GENERATE = """
import json, torch
import minipaged
from minipaged.model.qwen3 import random_qwen3, tiny_qwen3_config
from minipaged.runtime import TritonNotInstalledError, has_triton

model = random_qwen3(tiny_qwen3_config(), seed=0, dtype=torch.float32)
llm = minipaged.LLM(model, attention_backend=BACKEND, num_blocks=32, device="cpu")
params = minipaged.SamplingParams(temperature=0, max_tokens=6)
outputs = llm.generate([[5, 9, 2, 7], [3, 3, 8]], params, use_tqdm=False)
result = {"has_triton": has_triton(), "tokens": [o.outputs[0].token_ids for o in outputs],
          "finished": [o.finished for o in outputs]}
print("RESULT", json.dumps(result))
"""

REFUSALS = """
import json, torch
import minipaged
from minipaged.model.qwen3 import random_qwen3, tiny_qwen3_config
from minipaged.runtime import TritonNotInstalledError

model = random_qwen3(tiny_qwen3_config(), seed=0, dtype=torch.float32)
errors = {}
for backend in ("triton", "auto"):
    try:
        llm = minipaged.LLM(model, attention_backend=backend, num_blocks=32, device="cpu")
        errors[backend] = llm.llm_engine.attention_backend
    except TritonNotInstalledError as error:
        errors[backend] = f"{type(error).__name__}: {error}"
from minipaged.kernels.kv_cache import PagedKVCache
cache = PagedKVCache(1, 4, 2, 1, 4, torch.float32, "cpu")
cache.attention_backend = "triton"                # the kernel itself, asked for directly
key = torch.randn(1, 1, 4)
try:
    cache.write(0, key, key, torch.tensor([1]))
    errors["kernel"] = "ran"
except TritonNotInstalledError as error:
    errors["kernel"] = f"{type(error).__name__}: {error}"
errors["untouched"] = bool((cache.storage == 0).all())
print("RESULT", json.dumps(errors))
"""


def run_python(code: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")]
    return json.loads(line.removeprefix("RESULT "))


def test_the_torch_backend_generates_without_triton_as_with_it():
    without = run_python(BLOCK_TRITON + GENERATE.replace("BACKEND", "'torch'"))
    with_triton = run_python(GENERATE.replace("BACKEND", "'torch'"))
    assert without["has_triton"] is False and with_triton["has_triton"] is True
    assert without["finished"] == [True, True]
    assert [len(t) for t in without["tokens"]] == [6, 6]
    assert without["tokens"] == with_triton["tokens"]


def test_asking_for_triton_without_it_fails_with_what_to_install():
    errors = run_python(BLOCK_TRITON + REFUSALS)
    assert errors["auto"] == "torch"                     # auto never picks what is missing
    for asked in ("triton", "kernel"):
        kind, _, message = errors[asked].partition(": ")
        assert kind == "TritonNotInstalledError", errors[asked]
        assert "pip install triton" in message and "attention_backend='torch'" in message
    assert errors["untouched"], "a refused write must leave the cache as it was"
