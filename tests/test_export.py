"""The literate exporter (tools/export.py): chapters -> package + Colab twins, and the sync check."""

import ast
import json
import re
import sys
from importlib import import_module
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
  api: {api}
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


def add_chapter(book, stem, module, name, api=None):
    api = [name] if api is None else api
    text = CHAPTER.format(module=module, name=name, api="[" + ", ".join(api) + "]")
    (book / "chapters" / f"{stem}.md").write_text(text)


def top_level(book) -> tuple[dict, list]:
    """(_PUBLIC, __all__) of the generated ``minipaged/__init__.py``."""
    namespace = {}
    exec(export.expected_files()[book / "minipaged" / "__init__.py"], namespace)
    return namespace["_PUBLIC"], namespace["__all__"]


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
    assert top_level(book)[0] == {"answer": "second"}
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
    # markers lead back to the chapter and its section: one per cell, continued ones in the class
    assert source.count("# %% chapters/01_grown.md § A class in three cells\n") == 3
    assert "    # %% chapters/01_grown.md § A class in three cells\n    def doubled" in source


def test_the_notebook_runs_the_same_class_through_add_to_class():
    from minipaged.book.notebook import add_to_class

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


SECTIONS = """\
---
minipaged:
  module: sections
---

```{code-cell} ipython3
:tags: [export]

\"\"\"Before any heading.\"\"\"
```

# 11. The `engine`

## The `LLM` class: **its** [constructor](other.md) and {math}`x_1`

```{code-cell} ipython3
:tags: [export]

class LLM:
    pass
```

Prose, with a fenced example that is not a heading:

```text
# not a heading
```

```{code-cell} ipython3
:tags: [export]

def kv_cache_dtype():
    return "auto"
```

### `generate` ##

```{code-cell} ipython3
print("narration")
```

```{code-cell} ipython3
:tags: [export]

def generate():
    return []
```
"""


def sections_module(book, text=SECTIONS):
    (book / "chapters" / "11_sections.md").write_text(text)
    return export.expected_files()[book / "minipaged" / "sections.py"]


def test_markers_name_the_chapter_and_section_not_a_line(book):
    source = sections_module(book)
    markers = [line.strip() for line in source.splitlines() if line.lstrip().startswith("# %%")]
    assert markers == [
        "# %% chapters/11_sections.md",  # before the first heading: the chapter alone
        "# %% chapters/11_sections.md § The LLM class: its constructor and x_1",
        "# %% chapters/11_sections.md § The LLM class: its constructor and x_1",  # fence skipped
        "# %% chapters/11_sections.md § generate",
    ]
    assert not any(re.search(r"\.md:\d", m) for m in markers)


def test_moving_prose_leaves_the_package_unchanged(book):
    before = sections_module(book)
    moved = SECTIONS.replace("Prose, with", "A new paragraph.\n\nMore\nprose.\n\nProse, with")
    assert sections_module(book, moved) == before


CONSTRUCTED = """\
---
minipaged:
  module: grown
---

# Engine

```{code-cell} ipython3
:tags: [export]

class Engine:
    \"\"\"Runs steps.\"\"\"

    steps: int
    name = "engine"
    \"\"\"What the engine is called.\"\"\"

    def step(self):
        self.steps += 1
        return self.steps
```

## Pausing

```{code-cell} ipython3
:tags: [export]

@add_to_class(Engine)
def pause(self):
    return self.limit


# how far the engine goes
@add_to_class(Engine)
def __init__(self, limit=3):
    self.steps, self.limit = 0, limit


@add_to_class(Engine)
def resume(self):
    return self.step()
```

## Construction, later

```{code-cell} ipython3
:tags: [export]

@add_to_class(Engine)
def __post_init__(self):
    return None


@add_to_class(Engine)
def stop(self):
    return self.steps
```
"""


def test_constructors_move_to_the_top_of_the_grown_class(book):
    source = grown_module(book, CONSTRUCTED)
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef))
    methods = [n.name for n in cls.body if isinstance(n, ast.FunctionDef)]
    assert methods == ["__init__", "__post_init__", "step", "pause", "resume", "stop"]
    assert [type(n).__name__ for n in cls.body[:4]] == ["Expr", "AnnAssign", "Assign", "Expr"]
    # each constructor keeps its cell's marker (and its comment) with it
    assert ("    # %% chapters/01_grown.md § Pausing\n    # how far the engine goes\n"
            "    def __init__(self, limit=3):") in source
    assert "    # %% chapters/01_grown.md § Construction, later\n    def __post_init__" in source
    assert "    # %% chapters/01_grown.md § Pausing\n    def pause(self):" in source
    assert source.count("§ Pausing") == 2 and source.count("§ Construction, later") == 2
    namespace = {}
    exec(compile(source, "grown.py", "exec"), namespace)
    engine = namespace["Engine"](limit=7)
    assert (engine.pause(), engine.resume(), engine.resume(), engine.stop()) == (7, 1, 2, 2)


def test_a_constructor_is_moved_into_a_class_without_a_docstring(book):
    attributes = ('    \"\"\"Runs steps.\"\"\"\n\n    steps: int\n    name = "engine"\n'
                  '    \"\"\"What the engine is called.\"\"\"\n\n')
    text = CONSTRUCTED.replace(attributes, "    # one step at a time\n")
    source = grown_module(book, text)
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef))
    assert [n.name for n in cls.body][:3] == ["__init__", "__post_init__", "step"]
    assert "\n    # one step at a time\n    def step(self):" in source  # the comment stays
    exec(compile(source, "grown.py", "exec"), {})


def test_a_second_constructor_is_refused(book):
    text = CONSTRUCTED.replace("def __post_init__(self):", "def __init__(self):")
    with pytest.raises(SystemExit, match="chapters/01_grown.md:[0-9]+: .*defines __init__ again"):
        grown_module(book, text)


def test_only_api_names_are_top_level(book):
    add_chapter(book, "01_first", "first", "answer")
    chapter = book / "chapters" / "01_first.md"
    chapter.write_text(chapter.read_text().replace(
        "__all__ = ['answer']", "__all__ = ['answer', 'helper']\n\n\ndef helper():\n    return 1"))
    add_chapter(book, "02_second", "second", "other", api=[])
    public, names = top_level(book)
    assert public == {"answer": "first"} and names == ["answer"]
    init = export.expected_files()[book / "minipaged" / "__init__.py"]
    namespace = {}
    exec(init, namespace)
    with pytest.raises(AttributeError, match="from minipaged.second import other"):
        namespace["__getattr__"]("other")
    assert "def helper" in export.expected_files()[book / "minipaged" / "first.py"]


def test_an_api_name_the_module_does_not_export_is_refused(book):
    add_chapter(book, "01_first", "first", "answer", api=["answer", "missing"])
    with pytest.raises(SystemExit, match="01_first.md: `api:` lists 'missing'"):
        export.expected_files()


def test_a_later_chapter_supersedes_an_api_name_of_an_earlier_one(book):
    add_chapter(book, "01_first", "first", "answer")
    add_chapter(book, "02_second", "second", "answer", api=[])
    chapter = book / "chapters" / "02_second.md"
    chapter.write_text(chapter.read_text().replace("  api: []", "  supersedes: [answer]"))
    assert top_level(book) == ({"answer": "second"}, ["answer"])


def test_api_must_be_a_list_of_names(book):
    add_chapter(book, "01_first", "first", "answer")
    chapter = book / "chapters" / "01_first.md"
    chapter.write_text(chapter.read_text().replace("  api: [answer]", "  api: answer"))
    with pytest.raises(SystemExit, match="01_first.md: `api:` must be a list"):
        export.expected_files()


def test_the_package_top_level_is_small_and_every_name_resolves():
    import minipaged

    assert len(minipaged.__all__) <= 60, sorted(minipaged.__all__)
    assert sorted(minipaged._PUBLIC) == minipaged.__all__
    for name in minipaged.__all__:
        value = getattr(minipaged, name)
        module = import_module(f"minipaged.{minipaged._PUBLIC[name]}")
        assert value is getattr(module, name) and name in module.__all__
    from minipaged.memory.block_manager import TeachingBlockManager  # a book helper: its module only
    assert TeachingBlockManager and "TeachingBlockManager" not in minipaged.__all__
    assert minipaged.LLM is import_module("minipaged.entrypoints.llm").LLM  # the book's best engine
