"""Sphinx extension: figures and tables are numbered per chapter, "Figure 2.3" in chapter 2.

The chapters carry their number in their title and file name (``chapters/02_fragmentation``), not
in a numbered table of contents (Sphinx would count from 1, the introduction included). Sphinx
numbers the figures of each page 1, 2, ...; this puts the chapter's number in front, so a figure's
caption and every ``{numref}`` to it read "Figure 2.3". Other pages keep plain numbers.
"""

from __future__ import annotations

import re

CHAPTER = re.compile(r"^chapters/(\d\d)_")


def chapter_number(docname: str) -> int | None:
    """The number of a chapter page (``chapters/02_fragmentation`` -> 2), else None."""
    found = CHAPTER.match(docname)
    return int(found[1]) if found else None


def prefix_figure_numbers(app, env) -> list[str]:
    """Runs after Sphinx assigned the numbers: (n,) becomes (chapter, n) on chapter pages."""
    for docname, kinds in env.toc_fignumbers.items():
        number = chapter_number(docname)
        if number is None:
            continue
        for ids in kinds.values():
            for target, fignumber in ids.items():
                if len(fignumber) == 1:
                    ids[target] = (number, *fignumber)
    return []


def setup(app):
    # After the toctree collector's own handler (priority 500), which assigns the numbers.
    app.connect("env-get-updated", prefix_figure_numbers, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
