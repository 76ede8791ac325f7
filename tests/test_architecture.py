"""The package reads as a serving engine: one LLM assembled from parts, small classes, one place
that builds forward batches, no private name imported across modules."""

import ast
from pathlib import Path

import minipaged

PACKAGE = Path(minipaged.__file__).parent


def dotted(path: Path) -> str:
    """``engine.llm_engine`` for minipaged/engine/llm_engine.py."""
    return ".".join(path.relative_to(PACKAGE).with_suffix("").parts)


def modules():
    return {dotted(path): ast.parse(path.read_text()) for path in sorted(PACKAGE.rglob("*.py"))}


def classes():
    for name, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                yield name, node


def test_no_llm_class_subclasses_another():
    llms = [(module, node) for module, node in classes() if node.name.endswith("LLM")]
    assert [module for module, _ in llms] == ["entrypoints.llm"]      # one LLM, the package's
    assert all(not node.bases for _, node in llms)


def test_classes_are_short_and_the_llm_front_end_shorter():
    sizes = {(module, node.name): node.end_lineno - node.lineno + 1 for module, node in classes()}
    assert max(sizes.values()) <= 400, max(sizes.items(), key=lambda kv: kv[1])
    assert sizes["entrypoints.llm", "LLM"] <= 250


def test_the_engine_builds_forward_batches_in_the_model_runner_only():
    """Outside chapter 9's model (which defines ForwardBatch) only the model runner builds one;
    book helpers that run a model by hand (teacher forcing, greedy_generate) are not the engine."""
    engine_modules = {"engine.llm_engine", "engine.sampler", "engine.model_runner",
                      "entrypoints.llm", "engine.fused_sampler", "engine.overlap_scheduler",
                      "engine.scheduler"}
    builders = set()
    for name, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                target = func.value if isinstance(func, ast.Attribute) else func
                if getattr(target, "id", None) == "ForwardBatch" and name in engine_modules:
                    builders.add(name)
    assert builders == {"engine.model_runner"}


def test_the_engine_modules_import_no_private_name_of_another_module():
    for name in ("engine.llm_engine", "engine.sampler", "engine.model_runner", "entrypoints.llm"):
        for node in ast.walk(modules()[name]):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("minipaged"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, (name, node.module, private)


def test_no_module_imports_a_later_chapters_module():
    """The chapter that owns each module, by its generated header; imports go backwards only."""
    owner = {}
    for path in PACKAGE.rglob("*.py"):
        first = path.read_text().split("\n", 1)[0]
        if "chapters/" in first:
            owner[dotted(path)] = first.split("chapters/")[1][:2]
    for name, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("minipaged."):
                imported = node.module.removeprefix("minipaged.")
                if name in owner and imported in owner:
                    assert owner[imported] <= owner[name], (name, imported)


def test_a_cache_format_sits_below_the_engine():
    """Chapter 13's FP8 cache is a part the engine takes, so it imports nothing of the engine."""
    imported = {node.module for node in ast.walk(modules()["kernels.fp8_kv_cache"])
                if isinstance(node, ast.ImportFrom)}
    assert imported, "no import found: did the module move?"
    assert not {name for name in imported if name.startswith("minipaged.engine.llm_engine")}


def test_no_module_imports_a_private_name_of_another():
    for name, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("minipaged"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, (name, node.module, private)


def _manager_names(tree) -> set:
    """Names the code reads off a block manager (``self.manager.x``, ``manager.x``); ``in`` on
    the manager counts as ``__contains__``, a ``getattr``/``hasattr`` on it as that call."""
    def is_manager(node):
        return ((isinstance(node, ast.Attribute) and node.attr == "manager")
                or (isinstance(node, ast.Name) and node.id == "manager"))

    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_manager(node.value):
            names.add(node.attr)
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn))
                                                   for op in node.ops):
            if any(is_manager(c) for c in node.comparators):
                names.add("__contains__")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr") and node.args
              and is_manager(node.args[0])):
            names.add(node.func.id)
    return names


def _scheduler_classes():
    """Chapter 10's Scheduler and every class built on it (chapter 15's OverlapScheduler)."""
    found = [node for _, node in classes() if node.name == "Scheduler"
             or any(getattr(base, "id", None) == "Scheduler" for base in node.bases)]
    assert {node.name for node in found} >= {"Scheduler", "OverlapScheduler"}
    return found


def test_the_scheduler_uses_a_narrow_manager_seam_without_capability_checks():
    """vLLM v1's scheduler sees its KVCacheManager through a few calls and a KVCacheBlocks
    value; ours sees at most eight names of the block manager, the same for chapters 4-6."""
    from minipaged.memory.block_manager import KVBlockManager

    used, checks = set(), []
    for node in _scheduler_classes():
        used |= _manager_names(node)
        checks += [call for call in ast.walk(node) if isinstance(call, ast.Call)
                   and getattr(call.func, "id", None) in ("hasattr", "getattr")]
    assert used, "no use of the block manager found: did its attribute name change?"
    assert len(used) <= 8, sorted(used)
    assert not checks, "the scheduler asks what its manager can do"
    assert all(hasattr(KVBlockManager, name) for name in used), sorted(used)  # chapter 4 too


def test_beam_search_touches_no_block_manager_name():
    """Beam search forks and frees beams through the scheduler's step, like every request."""
    beam = [node for node in ast.walk(modules()["engine.llm_engine"])
            if isinstance(node, ast.FunctionDef) and "beam" in node.name]
    assert {node.name for node in beam} >= {"beam_search", "_beam_search_one", "_next_beams"}
    for node in beam:
        assert not _manager_names(node), (node.name, _manager_names(node))
        assert not [n for n in ast.walk(node) if isinstance(n, ast.Name) and n.id == "manager"]


LAYERS = {"memory", "kernels", "model", "engine", "entrypoints", "book"}


def test_the_package_is_laid_out_by_layer():
    """Every module sits in one layer's sub-package (memory, kernels, model, engine,
    entrypoints, book); at the top only the package's face, ``__main__`` and chapter 0's runtime."""
    top = {path.name for path in PACKAGE.glob("*.py")}
    assert top == {"__init__.py", "__main__.py", "runtime.py"}, top
    folders = {path.name for path in PACKAGE.iterdir() if path.is_dir() and path.name != "__pycache__"}
    assert folders == LAYERS, folders
    for layer in LAYERS:
        init = ast.parse((PACKAGE / layer / "__init__.py").read_text())
        assert ast.get_docstring(init), f"minipaged/{layer}/__init__.py says nothing of its layer"


def test_layers_import_downwards_only():
    """Memory management imports no kernel, model or engine; kernels no model or engine; the
    model no engine; nothing below the entry points imports them; book helpers nothing above."""
    rank = {"runtime": 0, "book.notebook": 0, "memory": 1, "kernels": 2, "model": 3,
            "engine": 4, "entrypoints": 5, "__main__": 6}

    def layer_rank(module: str) -> int:
        return rank.get(module, rank.get(module.split(".")[0], 0))

    for name, tree in modules().items():
        if name.startswith("book.") and name != "book.notebook":
            continue   # the book's simulators may use anything
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("minipaged."):
                imported = node.module.removeprefix("minipaged.")
                assert layer_rank(imported) <= layer_rank(name), (name, imported)
