"""Every "chapter N" in a chapter's prose is a link, found in the Markdown without building the book.

The rule is the one `tools/browser_check.js` applies to the rendered pages: a match of
``\\b[Cc]hapters? \\d{1,2}\\b`` in text that is not inside a link, code, a cell's output or a heading
(h1 to h4) is a mention a reader cannot click. Here the chapters are parsed with MyST's own Markdown
parser; directive bodies (exercises, solutions, admonitions, figure captions) are prose too, code
cells and code blocks are not, and roles ({ref}, {numref}, {glue:text}) render as links or values.
One difference, on the strict side: a mention broken across two source lines ("chapter" at the end
of one, "8" on the next) counts here, while the browser sees a line break and lets it pass.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The pages the browser check reads: the introduction and every chapter.
CHAPTERS = [ROOT / "intro.md"] + sorted((ROOT / "chapters").glob("[0-9][0-9]_*.md"))
MENTION = re.compile(r"\b[Cc]hapters? \d{1,2}\b")
NOT_PROSE = {"code-cell", "code-block", "code", "sourcecode", "math", "literalinclude", "raw",
             "glue", "glue:any", "glue:md"}
OPTION = re.compile(r"^\s*:[\w-]+:")


def parser():
    from markdown_it.renderer import RendererHTML
    from myst_parser.config.main import MdParserConfig
    from myst_parser.parsers.mdit import create_md_parser

    config = MdParserConfig(enable_extensions={"dollarmath", "amsmath", "colon_fence", "deflist",
                                               "substitution"})
    return create_md_parser(config, RendererHTML)


def _directive_body(content: str) -> str:
    lines = content.split("\n")
    if lines and lines[0].strip() == "---":  # options as YAML
        end = next((i for i, l in enumerate(lines[1:], 1) if l.strip() == "---"), 0)
        lines = lines[end + 1:]
    while lines and OPTION.match(lines[0]):
        lines = lines[1:]
    return "\n".join(lines)


def unlinked_mentions(markdown: str, md=None) -> list[tuple[int, str]]:
    """``(line, text)`` of each "chapter N" in the prose that is not a link (lines 1-based)."""
    md = md or parser()
    found: list[tuple[int, str]] = []

    def walk(text: str, offset: int) -> None:
        heading = 0
        for token in md.parse(text):
            line = offset + (token.map[0] if token.map else 0)
            if token.type == "heading_open":
                heading = int(token.tag[1])
            elif token.type == "heading_close":
                heading = 0
            elif token.type in ("fence", "colon_fence") and token.info.startswith("{"):
                name = token.info[1:].split("}", 1)[0]
                if name not in NOT_PROSE:
                    # the body starts on the line after the fence and its options
                    skipped = len(token.content.split("\n")) - len(
                        _directive_body(token.content).split("\n"))
                    walk(_directive_body(token.content), line + 1 + skipped)
            elif token.type == "inline" and not 1 <= heading <= 4:
                for start, run in _plain_runs(token.children or [], token.content):
                    found.extend((line + 1 + start + run[:m.start()].count("\n"), m[0])
                                 for m in MENTION.finditer(run.replace("\n", " ")))

    walk(markdown, 0)
    return found


def _plain_runs(children, source: str) -> list[tuple[int, str]]:
    """The runs of text a reader sees as plain words, outside links, code, math and roles, each
    with the line it starts on, counted from the first of ``source`` (the paragraph's Markdown);
    a line break is a newline."""
    runs: list[tuple[int, str]] = []
    current: list[str] = []
    in_link = cursor = start = 0
    for child in children:
        if child.type in ("text", "code_inline", "math_inline"):  # where it is, for its line
            found = source.find(child.content, cursor)
            if found >= 0:
                cursor = found
        plain = not in_link and child.type in ("text", "softbreak", "hardbreak")
        if plain:
            if not current:
                start = source.count("\n", 0, cursor)
            current.append(child.content if child.type == "text" else "\n")
        elif current:
            runs.append((start, "".join(current)))
            current = []
        if child.type in ("text", "code_inline", "math_inline") and found >= 0:
            cursor += len(child.content)
        elif child.type in ("softbreak", "hardbreak"):
            found = source.find("\n", cursor)
            cursor = found + 1 if found >= 0 else cursor
        in_link += {"link_open": 1, "link_close": -1}.get(child.type, 0)
    if current:
        runs.append((start, "".join(current)))
    return runs


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.stem)
def test_every_chapter_mention_in_the_prose_is_a_link(chapter):
    unlinked = unlinked_mentions(chapter.read_text())
    assert not unlinked, (
        f"{chapter.name}: link these, e.g. [chapter 8](08_paged_attention.md): "
        + "; ".join(f"line {line}: {text!r}" for line, text in unlinked))


def test_the_rule_finds_what_the_browser_check_finds():
    source = "\n".join([
        "# Chapter 3 in a title", "",
        "As chapter 3 showed, and [chapter 4](04_block_manager.md) and [chapters 5](05_sharing.md)",
        "and [6](06_prefix_caching.md) too; `chapter 7` is code, {ref}`chapter 8 <x>` a link, and",
        "chapter", "9 split over two lines.", "",
        "```{code-cell} ipython3", "# chapter 10 in code", "```", "",
        "```{exercise} 1.1 Count", ":label: ex-1", "", "Use chapter 11's count.", "```", "",
        "```text", "chapter 13 in a code block", "```",
    ])
    assert unlinked_mentions(source) == [(3, "chapter 3"), (5, "chapter 9"), (15, "chapter 11")]
