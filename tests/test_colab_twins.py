"""The Colab twins speak Colab's Markdown: no MyST left, solutions folded, chapter links to Colab."""

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from colab_twin import BookContext, colab_url, format_glued  # noqa: E402

TWINS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
CHAPTERS = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.md"))
GLUE_TEXT = re.compile(r"\{glue:text\}`([^`]*)`")
ROLE = re.compile(r"\{[A-Za-z][\w:.-]*\}`")  # a role's name starts with a letter: `{1}` is code
FENCE = re.compile(r"^\s*(`{3,}|:{3,})\{[\w:.-]+\}", re.M)
TARGET = re.compile(r"^\([\w.:-]+\)=\s*$", re.M)
CHAPTER_LINK = re.compile(r"\]\((?P<target>[^)]*\d\d_[\w-]+\.(?:md|ipynb)[^)]*)\)")


def markdown_of(twin: Path) -> str:
    cells = json.loads(twin.read_text())["cells"]
    return "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


@pytest.mark.parametrize("twin", TWINS, ids=lambda p: p.stem)
def test_no_myst_survives_in_a_twin(twin):
    text = markdown_of(twin)
    assert not ROLE.findall(text), f"MyST roles left: {ROLE.findall(text)[:5]}"
    assert not FENCE.findall(text), "MyST directive fences left"
    assert not TARGET.findall(text), f"(label)= targets left: {TARGET.findall(text)[:5]}"


@pytest.mark.parametrize("twin", TWINS, ids=lambda p: p.stem)
def test_solutions_are_folded_and_chapter_links_open_colab(twin):
    text = markdown_of(twin)
    chapter = (ROOT / "chapters" / f"{twin.stem}.md").read_text()
    assert text.count("<details><summary>Solution") == chapter.count("{solution}")
    assert text.count("<details>") == text.count("</details>")
    for link in CHAPTER_LINK.finditer(text):
        assert link["target"].startswith("https://colab.research.google.com/github/"), link[0]
        assert (ROOT / "notebooks" / Path(link["target"]).name).exists(), link[0]


def context() -> BookContext:
    book = BookContext("https://github.com/o/r", "dev",
                       references={"kwon2023vllm": ("Kwon et al., 2023", "https://arxiv.org/x")},
                       targets={"fig-a": "Figure “A map”", "sec-b": "“Section B”",
                                "ex-1-1": "Exercise 1.1"})
    return book


def test_roles_become_words_and_links():
    line = context().markdown(
        "At {glue:text}`rate:.1f` GB/s {cite}`kwon2023vllm`; see {numref}`fig-a`, "
        "{ref}`the next part <sec-b>`, {ref}`sec-b` and [chapter 3](03_block_tables.md#x).")
    assert line == ("At ⟨`rate`⟩ GB/s ([Kwon et al., 2023](https://arxiv.org/x)); see Figure “A map”, "
                    "the next part, “Section B” and [chapter 3]("
                    f"{colab_url('https://github.com/o/r', 'dev', '03_block_tables')}).")


def test_exercise_is_quoted_and_its_solution_folded_with_code_inside():
    source = "\n".join([
        "(sec-b)=", "## Exercises", "",
        "```{exercise} 1.1 Count blocks", ":label: ex-1-1", ":nonumber:", "",
        "How many blocks?", "```", "",
        "````{solution} ex-1-1", ":class: dropdown", "",
        "Three:", "```python", "blocks = 3", "```", "As {numref}`fig-a` shows.", "````",
    ])
    out = context().markdown(source)
    assert out.splitlines()[:2] == ['<a id="sec-b"></a>', "## Exercises"]
    assert "> **Exercise 1.1** Count blocks\n>\n> How many blocks?" in out
    folded = out[out.index("<details>"):]
    assert folded.startswith("<details><summary>Solution to Exercise 1.1</summary>")
    assert "```python\nblocks = 3\n```" in folded and "As Figure “A map” shows." in folded
    assert folded.rstrip().endswith("</details>") and ":class:" not in out


def test_admonition_becomes_a_titled_quote():
    out = context().markdown(":::{admonition} Pitfall: order\n:class: warning\nImport first.\n:::")
    assert out == "> **Pitfall: order**\n>\n> Import first."


def test_a_glued_figure_keeps_its_caption_and_glued_numbers_are_explained():
    out = context().markdown("```{glue:figure} fig_x\n:name: fig-x\n\nThe pool, by owner.\n```")
    assert out.startswith("*Figure: The pool, by owner.* (made by the code cell that calls "
                          "`glue(\"fig_x\", ...)`")
    for twin in TWINS:
        chapter = (ROOT / "chapters" / f"{twin.stem}.md").read_text()
        if "{glue:text}" in chapter:
            assert "*About the numbers:*" in markdown_of(twin).split("\n\n")[0], twin.name


def test_glued_values_are_filled_in_formatted_as_myst_nb_formats_them():
    book = context()
    book.glued = {"rate": "12.345", "tokens": "1234567", "share": "0.4251", "model": "'Qwen3_0.6B'",
                  "steps": "7"}
    line = book.markdown("{glue:text}`rate:.1f` GB/s, {glue:text}`tokens:,` tokens, "
                         "{glue:text}`share:.0%`, {glue:text}`model`, {glue:text}`steps:d` "
                         "and {glue:text}`lost:.2f`")
    assert line == r"12.3 GB/s, 1,234,567 tokens, 43%, Qwen3\_0.6B, 7 and ⟨`lost`⟩"
    assert book.placeholders == {"lost"}


@pytest.mark.parametrize("text, spec", [
    ("12.345", ".1f"), ("1234567", ","), ("0.4251", ".0%"), ("'a b'", "s"), ("7", "d"),
    ("3.0", ".3g"), ("12", ".2f"), ("2.5e-05", ".1e"), ("True", "s"), ("[1, 2]", "s"), ("x y", "s"),
])
def test_format_glued_is_myst_nb_format_plain_text(text, spec):
    myst_nb = pytest.importorskip("myst_nb.core.variables")
    assert format_glued(text, spec) == myst_nb.format_plain_text(text, spec)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.stem)
def test_every_glued_name_in_the_prose_has_a_recorded_value(chapter):
    """A chapter that glues a new name, or renames one, needs its record made again:
    `python tools/record_glued_values.py NN` (or `--from-book NN` after `make book`)."""
    prose = re.sub(r"```\{code-cell\}.*?```", "", chapter.read_text(), flags=re.S)
    used = GLUE_TEXT.findall(prose)
    if not used:
        return
    path = ROOT / "notebooks" / "glued" / f"{chapter.stem}.json"
    assert path.exists(), f"{chapter.name} glues numbers into its prose but {path.name} is missing"
    record = json.loads(path.read_text())
    assert record["chapter"] == f"chapters/{chapter.name}" and record["device"] and record["date"]
    values = record["values"]
    for content in used:
        name, spec = content.rsplit(":", 1) if ":" in content else (content, "s")
        assert name in values, (
            f"{chapter.name} uses {{glue:text}} `{name}`, which {path.name} has no value for; "
            f"record the chapter again: python tools/record_glued_values.py {chapter.name[:2]}")
        format_glued(values[name], spec)  # the format spec applies to the recorded value
    twin = markdown_of(ROOT / "notebooks" / f"{chapter.stem}.ipynb")
    assert "⟨`" not in twin, "a placeholder left where a value is recorded"
    assert f"device: {record['device']}; date: {record['date']}" in twin.split("\n\n")[0]
