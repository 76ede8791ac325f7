"""tools/hide_bookkeeping_cells.py: glue-only cells get remove-input, nothing else changes."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import hide_bookkeeping_cells as tool  # noqa: E402

BARE = "```{code-cell} ipython3\nglue(\"a\", 1)\nglue(\"b\", f(2));\n```\n"
SHORT = "```{code-cell} ipython3\n:tags: [hide-output]\n\nglue(\"a\", 1)\n```\n"
YAML = "```{code-cell} ipython3\n---\nmystnb:\n  x: 1\n---\nglue(\"a\", 1)\n```\n"
MIXED = "```{code-cell} ipython3\nx = 2\nglue(\"a\", x)\n```\n"
HIDDEN = "```{code-cell} ipython3\n:tags: [remove-cell]\n\nglue(\"a\", 1)\n```\n"


def test_glue_only_cells_are_tagged_in_each_option_style():
    text, tagged = tool.hide("\n".join([BARE, SHORT, YAML, MIXED, HIDDEN]))
    assert tagged == 3
    assert "```{code-cell} ipython3\n:tags: [remove-input]\n\nglue(\"a\", 1)\n" in text
    assert ":tags: [hide-output, remove-input]\n\nglue" in text
    assert "---\nmystnb:\n  x: 1\ntags: [remove-input]\n---\nglue" in text
    assert MIXED in text and HIDDEN in text, "other cells are untouched"
    assert tool.hide(text) == (text, 0), "running it again changes nothing"


def test_no_chapter_shows_a_glue_only_cell():
    for chapter in sorted((ROOT / "chapters").glob("[0-9][0-9]_*.md")):
        assert tool.hide(chapter.read_text())[1] == 0, (
            f"{chapter.name}: run python tools/hide_bookkeeping_cells.py")
