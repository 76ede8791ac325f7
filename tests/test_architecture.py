"""The package reads as a serving engine: one LLM assembled from parts, small classes, one place
that builds forward batches, no private name imported across modules."""

import ast
from pathlib import Path

import minipaged

PACKAGE = Path(minipaged.__file__).parent


def modules():
    return {path.stem: ast.parse(path.read_text()) for path in sorted(PACKAGE.glob("*.py"))}


def classes():
    for name, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                yield name, node


def test_no_llm_class_subclasses_another():
    llms = [(module, node) for module, node in classes() if node.name.endswith("LLM")]
    assert [module for module, _ in llms] == ["llm"]      # one LLM, the package's
    assert all(not node.bases for _, node in llms)


def test_classes_are_short_and_the_llm_front_end_shorter():
    sizes = {(module, node.name): node.end_lineno - node.lineno + 1 for module, node in classes()}
    assert max(sizes.values()) <= 400, max(sizes.items(), key=lambda kv: kv[1])
    assert sizes["llm", "LLM"] <= 250


def test_the_engine_builds_forward_batches_in_the_model_runner_only():
    """Outside chapter 9's model (which defines ForwardBatch) only the model runner builds one;
    book helpers that run a model by hand (teacher forcing, greedy_generate) are not the engine."""
    engine_modules = {"engine", "sampler", "model_runner", "llm", "fast_engine", "scheduler"}
    builders = set()
    for name, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                target = func.value if isinstance(func, ast.Attribute) else func
                if getattr(target, "id", None) == "ForwardBatch" and name in engine_modules:
                    builders.add(name)
    assert builders == {"model_runner"}


def test_the_engine_modules_import_no_private_name_of_another_module():
    for name in ("engine", "sampler", "model_runner", "llm"):
        for node in ast.walk(modules()[name]):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("minipaged"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, (name, node.module, private)


def test_no_module_imports_a_later_chapters_module():
    """The chapter that owns each module, by its generated header; imports go backwards only."""
    owner = {}
    for path in PACKAGE.glob("*.py"):
        first = path.read_text().split("\n", 1)[0]
        if "chapters/" in first:
            owner[path.stem] = first.split("chapters/")[1][:2]
    for name, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("minipaged."):
                imported = node.module.split(".")[1]
                if name in owner and imported in owner:
                    assert owner[imported] <= owner[name], (name, imported)


def test_a_cache_format_sits_below_the_engine():
    """Chapter 12's FP8 cache is a part the engine takes, so it imports nothing of the engine."""
    imported = {node.module for node in ast.walk(modules()["fp8_kv_cache"])
                if isinstance(node, ast.ImportFrom)}
    assert not imported & {"minipaged.engine", "minipaged.model_runner", "minipaged.sampler"}


def test_no_module_imports_a_private_name_of_another():
    for name, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("minipaged"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, (name, node.module, private)
