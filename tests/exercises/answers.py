"""Load a learner's answers (exercises/) or the reference solutions (solutions/) by module name."""

import importlib.util
import os
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent.parent
FOLDERS = ("exercises", "solutions")


def answers_dir() -> Path:
    """The folder $MINIPAGED_ANSWERS names: `exercises` (the default), `solutions`, or the path of
    another folder of answers laid out like exercises/ (the report's own tests use one)."""
    folder = os.environ.get("MINIPAGED_ANSWERS", "exercises")
    if folder in FOLDERS:
        return ROOT / folder
    if os.path.isabs(folder) and os.path.isdir(folder):
        return Path(folder)
    raise ValueError(f"MINIPAGED_ANSWERS must be one of {FOLDERS} or an absolute path to a "
                     f"folder, not {folder!r}")


def load(name: str) -> ModuleType:
    """Import `<folder>/<name>.py`, the folder chosen by $MINIPAGED_ANSWERS (default: exercises)."""
    folder = answers_dir()
    return _import(folder / f"{name}.py", f"{folder.name}_{name}")


def reference(name: str) -> ModuleType:
    """Import the reference solution `solutions/<name>.py`, whatever $MINIPAGED_ANSWERS says:
    the graders' own tests pass it through the grading."""
    return _import(ROOT / "solutions" / f"{name}.py", f"reference_{name}")


def _import(path: Path, module_name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
