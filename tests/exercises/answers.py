"""Load a learner's answers (exercises/) or the reference solutions (solutions/) by module name."""

import importlib.util
import os
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent.parent
FOLDERS = ("exercises", "solutions")


def load(name: str) -> ModuleType:
    """Import `<folder>/<name>.py`, the folder chosen by $MINIPAGED_ANSWERS (default: exercises)."""
    folder = os.environ.get("MINIPAGED_ANSWERS", "exercises")
    if folder not in FOLDERS:
        raise ValueError(f"MINIPAGED_ANSWERS must be one of {FOLDERS}, not {folder!r}")
    path = ROOT / folder / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{folder}_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
