# GENERATED from chapters/00_runtime.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/00_runtime.md:33
"""Where minipaged runs: GPU or CPU, real sizes or small ones, compiled or interpreted kernels."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypeVar

import torch

__all__ = ["has_gpu", "default_device", "by_device", "results_path", "uses_triton_interpreter",
           "add_to_class", "glue"]

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


# %% chapters/00_runtime.md:109
def add_to_class(cls: type):
    """Decorator: attach the decorated function (or property, staticmethod, classmethod) to ``cls``.

    ``@add_to_class(Manager)`` above ``def step(self): ...`` makes ``Manager.step`` exist from then
    on, for instances made before and after.
    """

    def attach(member):
        function = getattr(member, "fget", None) or getattr(member, "__func__", None) or member
        name = function.__name__
        setattr(cls, name, member)
        if hasattr(member, "__set_name__"):  # e.g. functools.cached_property
            member.__set_name__(cls, name)
        return member

    return attach


# %% chapters/00_runtime.md:155
def glue(name: str, value: T, display: bool = False) -> T:
    """Hand ``value`` to the book's prose as ``{glue:text}`name``` (myst-nb), and return it.

    Without myst-nb (Colab, a plain Jupyter) the value is shown when ``display`` is true.
    """
    try:
        from myst_nb import glue as myst_glue
    except ImportError:
        if display:
            from IPython.display import display as show

            show(value)
        return value
    myst_glue(name, value, display=display)
    return value
