# GENERATED from chapters/14_fast_engine.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/14_fast_engine.md § Residual add and RMSNorm
"""A fused kernel timed against the lines it replaces (chapters 14 and 15)."""

from __future__ import annotations

from typing import Callable

from minipaged.runtime import has_gpu

__all__ = ["kernel_times"]


def kernel_times(name: str, reference: Callable, fused: Callable,
                 make_inputs: Callable[[int], tuple], recorded: list[dict],
                 sizes: tuple[int, ...] = (256, 8192)) -> list[dict]:
    """Microseconds of ``reference`` and ``fused`` at each token count of ``sizes``.

    Where a GPU is present both are timed now, on the arguments ``make_inputs(tokens)``;
    elsewhere the answer is the rows of ``recorded`` (a record of ``results/``) whose
    ``kernel`` is ``name``. A row holds kernel, tokens, reference_us and fused_us.
    """
    if not has_gpu():
        return [row for row in recorded if row["kernel"] == name]
    import triton.testing

    rows = []
    for tokens in sizes:
        args = make_inputs(tokens)
        ref_us, fused_us = (1e3 * triton.testing.do_bench(lambda f=f: f(*args))
                            for f in (reference, fused))
        rows.append({"kernel": name, "tokens": tokens, "reference_us": ref_us,
                     "fused_us": fused_us})
    return rows
