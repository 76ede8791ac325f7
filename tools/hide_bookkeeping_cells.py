"""Hide the input of code cells that only hand numbers to the prose.

A cell whose code is nothing but ``glue(...)`` calls is bookkeeping: the reader sees the numbers
in the text, not the calls. This adds the ``remove-input`` tag to every such cell of the chapters
given (all chapters by default), editing the option lines in place and nothing else. A cell that
already hides or removes its input is left alone. Running it again changes nothing.

    python tools/hide_bookkeeping_cells.py                      # every chapter
    python tools/hide_bookkeeping_cells.py chapters/0[0-6]_*.md # some
    python tools/hide_bookkeeping_cells.py --check              # exit 1 if a cell would change
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TAG = "remove-input"
HIDDEN = {"remove-input", "remove-cell", "hide-input", "hide-cell"}
CELL = re.compile(r"^(?P<fence>```\{code-cell\}[^\n]*\n)(?P<body>.*?)^```[ \t]*$", re.M | re.S)


def only_glue(code: str) -> bool:
    """True when the code is one or more ``glue(...)`` calls and nothing else."""
    try:
        body = ast.parse(code).body
    except SyntaxError:
        return False
    return bool(body) and all(
        isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
        and getattr(node.value.func, "id", None) == "glue"
        for node in body)


def _split(body: str) -> tuple[list[str], str, str]:
    """A cell's (option lines, their kind: "yaml", "short" or "", code)."""
    lines = body.split("\n")
    if lines[0].strip() == "---":
        end = lines.index("---", 1)
        return lines[1:end], "yaml", "\n".join(lines[end + 1:])
    options = []
    while lines and lines[0].startswith(":"):
        options.append(lines.pop(0))
    return options, "short" if options else "", "\n".join(lines)


def _with_tag(options: list[str], kind: str) -> list[str] | None:
    """The option lines with ``remove-input`` added, or None if the cell hides its input already."""
    key = "tags:" if kind == "yaml" else ":tags:"
    for i, line in enumerate(options):
        if line.startswith(key):
            tags = [t.strip() for t in line[len(key):].strip().strip("[]").split(",") if t.strip()]
            if HIDDEN & set(tags):
                return None
            return options[:i] + [f"{key} [{', '.join(tags + [TAG])}]"] + options[i + 1:]
    return options + [f"{key} [{TAG}]"]


def hide(text: str) -> tuple[str, int]:
    """The chapter with its glue-only cells tagged, and how many it tagged."""
    tagged = 0

    def rewrite(match: re.Match) -> str:
        nonlocal tagged
        options, kind, code = _split(match["body"])
        if not only_glue(code):
            return match[0]
        new = _with_tag(options, kind or "short")
        if new is None:
            return match[0]
        tagged += 1
        if kind == "yaml":
            head = "---\n" + "\n".join(new) + "\n---\n"
        else:
            head = "\n".join(new) + "\n" + ("" if code.startswith("\n") or kind else "\n")
        return match["fence"] + head + code + "```"

    return CELL.sub(rewrite, text), tagged


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", type=Path)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 on a change")
    args = parser.parse_args()
    chapters = args.chapters or sorted((ROOT / "chapters").glob("[0-9][0-9]_*.md"))
    changed = 0
    for chapter in chapters:
        text = chapter.read_text()
        new, tagged = hide(text)
        if tagged:
            changed += 1
            print(f"{chapter}: {tagged} cell(s) {'to hide' if args.check else 'hidden'}")
            if not args.check:
                chapter.write_text(new)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
