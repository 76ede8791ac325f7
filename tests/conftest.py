"""Shared test set-up: the repository root on sys.path, and the Triton interpreter on CPU-only machines."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

try:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:  # pragma: no cover - torch is a hard dependency
    pass


import pytest  # noqa: E402


@pytest.fixture
def fail_on_take(monkeypatch):
    """``fail_on_take(manager, n)``: the manager's ``n``-th block allocation raises
    ``RuntimeError("injected failure")``; returns the list of (count, seq_id) calls seen.
    ``monkeypatch.undo()`` in the test restores the real allocator."""

    def install(manager, n: int) -> list:
        real, calls = manager._take_blocks, []

        def flaky(count, seq_id):
            calls.append((count, seq_id))
            if len(calls) == n:
                raise RuntimeError("injected failure")
            return real(count, seq_id)

        monkeypatch.setattr(manager, "_take_blocks", flaky)
        return calls

    return install
