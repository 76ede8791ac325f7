"""Sphinx extension: a chapter's execution cache follows the recorded results it reads.

Jupyter Book executes a chapter again only when the key of its cached run changes, and that key is
a hash of the chapter's code cells: a new ``results/engine_h200.json`` alone would leave the book
showing the old numbers. So, as each chapter is read, this appends one hidden code cell, a comment
naming every file of ``results/`` the chapter's code mentions with a hash of its contents. The
chapter file on disk is not touched; its cache key changes exactly when one of its inputs does.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

CODE_CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(.*?)^```\s*$", re.M | re.S)
JSON_NAME = re.compile(r"[\w.-]+\.json\b")


def results_read(text: str, results: Path) -> list[Path]:
    """The files of ``results`` that the chapter's code cells name, sorted."""
    names = {m.group(0) for cell in CODE_CELL.findall(text) for m in JSON_NAME.finditer(cell)}
    return sorted(results / name for name in names if (results / name).is_file())


def inputs_cell(text: str, results: Path) -> str:
    """The hidden code cell that records the chapter's inputs, or "" when it reads none."""
    files = results_read(text, results)
    if not files:
        return ""
    lines = [f"# {path.name} sha256:{hashlib.sha256(path.read_bytes()).hexdigest()[:16]}"
             for path in files]
    return ("\n\n```{code-cell} ipython3\n:tags: [remove-cell]\n\n"
            "# The recorded results this chapter reads (their hashes key its execution cache):\n"
            + "\n".join(lines) + "\n```\n")


def stamp(app, docname: str, source: list[str]) -> None:
    if not docname.startswith("chapters/"):
        return
    source[0] = source[0] + inputs_cell(source[0], Path(app.srcdir) / "results")


def setup(app):
    app.connect("source-read", stamp)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
