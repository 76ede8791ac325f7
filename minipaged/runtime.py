# GENERATED from chapters/00_runtime.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

"""Where minipaged runs: GPU or CPU, real sizes or small ones, compiled or interpreted kernels."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypeVar

import torch

__all__ = ["has_gpu", "default_device", "by_device", "results_path", "uses_triton_interpreter"]

T = TypeVar("T")

if not torch.cuda.is_available():
    # Must happen before any @triton.jit runs: Triton reads it when a kernel is defined.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def has_gpu() -> bool:
    """True when a CUDA GPU is visible to torch."""
    return torch.cuda.is_available()


def default_device() -> torch.device:
    """The device chapters and the engine use unless told otherwise."""
    return torch.device("cuda") if has_gpu() else torch.device("cpu")


def by_device(cpu: T, gpu: T) -> T:
    """Pick a size (or anything) by where we run: ``by_device(cpu=64, gpu=32768)``."""
    return gpu if has_gpu() else cpu


def uses_triton_interpreter() -> bool:
    """True when Triton kernels run in the (slow, CPU) interpreter instead of being compiled."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def results_path(name: str) -> Path:
    """Path of a recorded measurement, ``results/<name>``, in the repository that holds this package.

    Falls back to ``./results/<name>`` (for a notebook run from the repository root).
    """
    beside_package = Path(__file__).resolve().parent.parent / "results" / name
    return beside_package if beside_package.exists() else Path("results") / name
