# GENERATED from chapters/00_runtime.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/00_runtime.md § One switch
"""Where minipaged runs: GPU or CPU, real or small sizes, compiled or interpreted."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import TypeVar

import torch

__all__ = ["has_gpu", "default_device", "by_device", "results_path",
           "uses_triton_interpreter", "TritonImportOrderError", "has_triton",
           "TritonNotInstalledError"]

T = TypeVar("T")

if not torch.cuda.is_available():
    # Before any @triton.jit runs: Triton reads this when a kernel is defined.
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
    """True when Triton kernels run in the (slow, CPU) interpreter, not compiled."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def results_path(name: str) -> Path:
    """Path of a recorded measurement, ``results/<name>``, in this package's repository.

    Falls back to ``./results/<name>`` (for a notebook run from the repository root).
    """
    beside_package = Path(__file__).resolve().parent.parent / "results" / name
    return beside_package if beside_package.exists() else Path("results") / name


# %% chapters/00_runtime.md § When Triton was imported first
class TritonImportOrderError(RuntimeError):
    """Triton was imported before minipaged, on a machine that needs its interpreter."""


def _interpret_triton_language() -> int:
    """Rebuild as interpreted the ``triton.language`` functions made before the switch.

    Returns how many it rebuilt (0 when Triton came after the switch, or not at all).
    """
    if not uses_triton_interpreter() or sys.modules.get("triton.language") is None:
        return 0
    try:
        import triton
        from triton.language.core import _tensor_member_fn, tensor
        from triton.runtime.jit import JITFunction

        rebuilt: dict[int, tuple] = {}  # id(compiled) -> (compiled, interpreted)

        def interpreted(compiled):
            if id(compiled) not in rebuilt:
                rebuilt[id(compiled)] = (compiled, triton.jit(compiled.fn))
                if isinstance(rebuilt[id(compiled)][1], JITFunction):
                    raise TypeError("triton.jit ignores TRITON_INTERPRET=1")
            return rebuilt[id(compiled)][1]

        for name, module in list(sys.modules.items()):
            if module is None or not (name + ".").startswith("triton.language."):
                continue
            for attribute, value in list(vars(module).items()):
                if type(value) is JITFunction:
                    setattr(module, attribute, interpreted(value))
        for value in list(vars(tensor).values()):
            if type(value) is JITFunction:
                _tensor_member_fn(interpreted(value))  # the method form, x.max()
    except Exception as error:  # any failure here means: this Triton cannot be repaired
        raise TritonImportOrderError(
            "Triton was imported before minipaged turned on its interpreter: put "
            "`import minipaged` first, or set TRITON_INTERPRET=1 before starting Python"
        ) from error
    return len(rebuilt)


_rebuilt_at_import = _interpret_triton_language()


# %% chapters/00_runtime.md § Where Triton is not installed
class TritonNotInstalledError(ImportError):
    """A Triton kernel was launched where Triton is not installed."""


NO_TRITON = ("Triton is not installed: `pip install triton` (Linux only; Triton has no "
             "wheels for macOS or Windows), or use attention_backend='torch'")


class _KernelWithoutTriton:
    """What ``@triton.jit`` makes without Triton: the function, which cannot be launched."""

    def __init__(self, fn) -> None:
        functools.update_wrapper(self, fn)

    def __getitem__(self, grid):
        raise TritonNotInstalledError(f"kernel {self.__name__}: {NO_TRITON}")

    def __call__(self, *args, **kwargs):
        raise TritonNotInstalledError(f"kernel {self.__name__}: {NO_TRITON}")


class _WithoutTriton:
    """Stands in for ``triton`` or ``triton.language``: ``jit`` works, other names raise."""

    def __init__(self, name: str) -> None:
        self.__name__ = name

    def jit(self, fn=None, **options):
        """``@triton.jit`` or ``@triton.jit(option=...)`` on a kernel that cannot launch."""
        return self.jit if fn is None else _KernelWithoutTriton(fn)

    def __getattr__(self, name: str):
        if name.startswith("__"):  # copy, pickle and inspect ask for these
            raise AttributeError(name)
        raise TritonNotInstalledError(f"{self.__name__}.{name}: {NO_TRITON}")


try:
    import triton
    import triton.language as tl
except ImportError:
    triton, tl = _WithoutTriton("triton"), _WithoutTriton("triton.language")


def has_triton() -> bool:
    """True when Triton is installed, so its kernels run (compiled, or interpreted)."""
    return not isinstance(triton, _WithoutTriton)
