"""The literate exporter (tools/export.py): chapters -> package + Colab twins, and the sync check."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import export  # noqa: E402

CHAPTER = """\
---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
kernelspec:
  display_name: Python 3
  language: python
  name: python3
minipaged:
  module: {module}
---

# A chapter

```{{code-cell}} ipython3
:tags: [export]

__all__ = [{name!r}]


def {name}():
    return 42
```

```{{code-cell}} ipython3
print("narration is not exported")
```
"""


@pytest.fixture
def book(tmp_path, monkeypatch):
    (tmp_path / "chapters").mkdir()
    (tmp_path / "_config.yml").write_text(
        "repository:\n  url: https://github.com/example/course\n  branch: dev\n")
    monkeypatch.setattr(export, "ROOT", tmp_path)
    monkeypatch.setattr(export, "CHAPTERS", tmp_path / "chapters")
    monkeypatch.setattr(export, "PACKAGE", tmp_path / "minipaged")
    monkeypatch.setattr(export, "NOTEBOOKS", tmp_path / "notebooks")
    return tmp_path


def add_chapter(book, stem, module, name):
    (book / "chapters" / f"{stem}.md").write_text(CHAPTER.format(module=module, name=name))


def test_export_writes_module_init_and_colab_twin(book, capsys):
    add_chapter(book, "01_first", "first", "answer")
    export.write(export.expected_files())
    module = (book / "minipaged" / "first.py").read_text()
    assert module.startswith("# GENERATED from chapters/01_first.md")
    assert "def answer" in module and "narration" not in module
    assert '"answer": "first"' in (book / "minipaged" / "__init__.py").read_text()
    twin = json.loads((book / "notebooks" / "01_first.ipynb").read_text())
    setup = "".join(twin["cells"][0]["source"])
    assert "google.colab" in setup and "https://github.com/example/course" in setup and '"dev"' in setup
    assert all(c.get("outputs", []) == [] for c in twin["cells"] if c["cell_type"] == "code")
    exec(compile(setup, "setup", "exec"), {})  # outside Colab the set-up cell does nothing
    assert export.check(export.expected_files()) == 0


def test_check_fails_with_a_diff_on_a_hand_edit_and_on_a_stale_file(book, capsys):
    add_chapter(book, "01_first", "first", "answer")
    export.write(export.expected_files())
    generated = book / "minipaged" / "first.py"
    generated.write_text(generated.read_text().replace("return 42", "return 43"))
    (book / "minipaged" / "orphan.py").write_text("")
    assert export.check(export.expected_files()) == 1
    err = capsys.readouterr().err
    assert "-    return 43" in err and "+    return 42" in err
    assert "not produced by any chapter: minipaged/orphan.py" in err


def test_export_is_deterministic(book):
    add_chapter(book, "01_first", "first", "answer")
    assert export.expected_files() == export.expected_files()


def test_one_module_per_chapter_and_one_owner_per_public_name(book):
    add_chapter(book, "01_first", "first", "answer")
    add_chapter(book, "02_second", "first", "other")
    with pytest.raises(SystemExit, match="one chapter owns one module"):
        export.expected_files()
    add_chapter(book, "02_second", "second", "answer")
    with pytest.raises(SystemExit, match="already exported"):
        export.expected_files()


def test_a_later_chapter_supersedes_a_public_name_only_when_it_says_so(book):
    add_chapter(book, "01_first", "first", "answer")
    add_chapter(book, "02_second", "second", "answer")
    chapter = book / "chapters" / "02_second.md"
    chapter.write_text(chapter.read_text().replace(
        "  module: second", "  module: second\n  supersedes: [answer]"))
    init = export.expected_files()[book / "minipaged" / "__init__.py"]
    assert '"answer": "second"' in init and '"answer": "first"' not in init
    chapter.write_text(chapter.read_text().replace("[answer]", "[other]"))
    with pytest.raises(SystemExit, match="supersedes 'other'"):
        export.expected_files()


@pytest.mark.parametrize("extra", ["__all__ += ['more']", "__all__ = ['a'] + ['b']",
                                   "__all__ = ['again']"])
def test_all_must_be_one_literal_list(book, extra):
    add_chapter(book, "01_first", "first", "answer")
    chapter = book / "chapters" / "01_first.md"
    chapter.write_text(chapter.read_text().replace("def answer():", f"{extra}\n\n\ndef answer():"))
    with pytest.raises(SystemExit, match="01_first.md: .*__all__"):
        export.expected_files()


GROWN = """\
---
minipaged:
  module: grown
---

# A class in three cells

```{code-cell} ipython3
:tags: [export]

__all__ = ["Box"]


class Box:
    \"\"\"Holds one value.\"\"\"

    def __init__(self, value):
        self.value = value


def helper():
    return 1
```

Prose between the cells.

```{code-cell} ipython3
:tags: [export]

@add_to_class(Box)
def doubled(self):
    \"\"\"Twice the value.\"\"\"
    return 2 * self.value


@add_to_class(Box)
@property
def negated(self):
    return -self.value
```

```{code-cell} ipython3
:tags: [export]

@add_to_class(Box)
def tripled(self):
    return 3 * self.value
```
"""


def grown_module(book, text=GROWN):
    (book / "chapters" / "01_grown.md").write_text(text)
    return export.expected_files()[book / "minipaged" / "grown.py"]


def test_continued_cells_become_one_ordinary_class(book):
    source = grown_module(book)
    assert "add_to_class" not in source
    namespace = {}
    exec(compile(source, "grown.py", "exec"), namespace)
    box = namespace["Box"](5)
    assert (box.doubled(), box.negated, box.tripled()) == (10, -5, 15)
    assert namespace["Box"].doubled.__doc__ == "Twice the value."
    classes = [n for n in __import__("ast").parse(source).body if hasattr(n, "name")]
    assert [n.name for n in classes] == ["Box", "helper"]  # methods went inside, helper stayed out
    # markers lead back to the chapter: one per cell, the continued ones inside the class
    assert source.count("# %% chapters/01_grown.md:") == 3
    assert "    # %% chapters/01_grown.md:" in source


def test_the_notebook_runs_the_same_class_through_add_to_class():
    from minipaged.runtime import add_to_class

    class Box:
        def __init__(self, value):
            self.value = value

    made_before = Box(2)

    @add_to_class(Box)
    @property
    def negated(self):
        return -self.value

    @add_to_class(Box)
    @staticmethod
    def unit():
        return 1

    assert made_before.negated == -2 and Box.unit() == 1


@pytest.mark.parametrize("cell, error", [
    ("@add_to_class(Missing)\ndef f(self):\n    return 1", "no earlier export cell .* class Missing"),
    ("@add_to_class(Box)\ndef f(self):\n    return 1\n\n\nX = 1", "only functions"),
    ("@add_to_class(Box)\ndef f(self):\n    return '''a\nb'''", "multi-line string"),
])
def test_bad_continued_cells_are_refused_with_the_chapter_line(book, cell, error):
    text = GROWN + "\n```{code-cell} ipython3\n:tags: [export]\n\n" + cell + "\n```\n"
    with pytest.raises(SystemExit, match=f"chapters/01_grown.md:[0-9]+: .*{error}"):
        grown_module(book, text)
