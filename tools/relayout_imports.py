"""Rewrite minipaged module names from the flat layout to the layout by layer (memory, kernels,
model, engine, entrypoints, book), for a branch made before it: `python tools/relayout_imports.py .`
from the branch's root, then re-export. Idempotent."""
import re
import sys
from pathlib import Path

MODULES = {
    "sizing": "memory.sizing",
    "block_table": "memory.block_table",
    "block_manager": "memory.block_manager",
    "sharing": "memory.sharing",
    "prefix_cache": "memory.prefix_cache",
    "kv_cache": "kernels.kv_cache",
    "decode_attention": "kernels.decode_attention",
    "fp8_kv_cache": "kernels.fp8_kv_cache",
    "balanced_decode": "kernels.balanced_decode",
    "qwen3": "model.qwen3",
    "scheduler": "engine.scheduler",
    "engine": "engine.llm_engine",
    "sampler": "engine.sampler",
    "model_runner": "engine.model_runner",
    "detokenizer": "engine.detokenizer",
    "fast_engine": "engine.fast_engine",
    "llm": "entrypoints.llm",
    "engine_loop": "entrypoints.engine_loop",
    "engine_bridge": "entrypoints.engine_bridge",
    "openai_server": "entrypoints.openai_server",
    "openai_protocol": "entrypoints.openai_protocol",
    "metrics": "entrypoints.metrics",
    "dashboard": "entrypoints.dashboard",
    "cli": "entrypoints.cli",
    "fragmentation": "book.fragmentation",
}
# names that leave their module: (old module, name) -> new module
NAMES = {("runtime", "glue"): "book.notebook", ("runtime", "add_to_class"): "book.notebook"}
for _name in ("fp8_round_trip per_tensor_calibrated per_block_first_token per_slot synthetic_keys "
              "dense_attention SCHEMES accuracy_sweep teacher_forced logit_agreement RoundTripKVCache "
              "row_store CalibratedStore attention_inputs causal_attention channel_ratio "
              "real_key_errors").split():
    NAMES[("kernels.fp8_kv_cache", _name)] = "book.fp8_accuracy"

SUBMODULES_OF_ENGINE = "|".join(v.split(".")[1] for v in MODULES.values() if v.startswith("engine."))
OLD = "|".join(sorted(MODULES, key=len, reverse=True))
# minipaged.OLD not followed by a word char; for "engine", not followed by one of its new submodules
DOTTED = re.compile(rf"\bminipaged\.({OLD})\b(?!\.(?:{SUBMODULES_OF_ENGINE})\b)")
PATHED = re.compile(rf"\bminipaged/({OLD})\.py\b")
FRONT = re.compile(rf"^(  module: )({OLD})$", re.M)
TAG = re.compile(rf"\bmodule=({OLD})\b(?![.\w])")
FROM_PACKAGE = re.compile(rf"\bfrom minipaged import ({OLD})\b(?=[ \t]*(?:#|$))", re.M)
FROM_IMPORT = re.compile(r"from minipaged\.(runtime|kernels\.fp8_kv_cache) import (\([^)]*\)|[^\n]*)")


def format_import(module: str, names: list[str], comment: str) -> str:
    line = f"from minipaged.{module} import {', '.join(names)}{comment}"
    if len(line) <= 100:
        return line
    head = f"from minipaged.{module} import ("
    out, current = [], head
    for i, name in enumerate(names):
        piece = name + ("," if i < len(names) - 1 else ")")
        if len(current) + len(piece) + 1 > 100 - (len(comment) if not out else 0):
            out.append(current.rstrip())
            current = " " * len(head) + piece + " "
        else:
            current += piece + " "
    out.append(current.rstrip())
    out[0] += comment
    return "\n".join(out)


def split_runtime_import(match: re.Match) -> str:
    source, body = match.group(1), match.group(2)
    comments = re.findall(r"#[^\n]*", body)
    body = re.sub(r"#[^\n]*", "", body)
    comment = ("  " + comments[0].strip()) if comments else ""
    names = [n.strip() for n in body.strip().strip("()").replace("\n", " ").split(",") if n.strip()]
    moved, kept = {}, []
    for n in names:
        target = NAMES.get((source, n.split(" as ")[0].strip()))
        if target:
            moved.setdefault(target, []).append(n)
        else:
            kept.append(n)
    if not moved:
        return match.group(0)
    blocks = []
    if kept:
        blocks.append(format_import(source, kept, comment))
    for target, ns in moved.items():
        blocks.append(format_import(target, ns, comment if not blocks else comment))
    start = match.string.rfind("\n", 0, match.start()) + 1
    indent = match.string[start:match.start()]
    if indent.strip():
        indent = ""
    return "\n".join(blocks).replace("\n", "\n" + indent) if indent else "\n".join(blocks)


PAREN_IMPORT = re.compile(r"^([ \t]*)from (minipaged\.[\w.]+) import \(([^)]*)\)([^\n]*)$", re.M)


def reflow(match: re.Match) -> str:
    indent, module, body, after = match.groups()
    comments = re.findall(r"#[^\n]*", body + after)
    if len(comments) > 1:
        return match.group(0)
    names = [n.strip() for n in re.sub(r"#[^\n]*", "", body).replace("\n", " ").split(",")
             if n.strip()]
    comment = ("  " + comments[0].strip()) if comments else ""
    text = format_import(module.removeprefix("minipaged."), names, comment)
    return "\n".join(indent + line for line in text.split("\n"))


def rewrite(text: str, is_chapter: bool) -> str:
    text = FROM_PACKAGE.sub(lambda m: "from minipaged.{} import {}".format(
        *MODULES[m.group(1)].rsplit(".", 1)), text)
    text = DOTTED.sub(lambda m: f"minipaged.{MODULES[m.group(1)]}", text)
    text = PATHED.sub(lambda m: f"minipaged/{MODULES[m.group(1)].replace('.', '/')}.py", text)
    if is_chapter:
        text = FRONT.sub(lambda m: m.group(1) + MODULES[m.group(2)], text)
        text = TAG.sub(lambda m: f"module={MODULES[m.group(1)]}", text)
    text = FROM_IMPORT.sub(split_runtime_import, text)
    text = PAREN_IMPORT.sub(reflow, text)
    return text


def main(root: Path) -> None:
    globs = ["chapters/*.md", "tests/**/*.py", "benchmarks/**/*.py", "tools/*.py", "tools/*.sh",
             "tools/*.js", "solutions/*.py", "exercises/*.py", "_ext/*.py", "*.md", "Makefile",
             "pyproject.toml", ".github/workflows/*.yml", "_config.yml", "requirements/*"]
    changed = 0
    for pattern in globs:
        for path in root.glob(pattern):
            if not path.is_file():
                continue
            old = path.read_text()
            new = rewrite(old, path.parent.name == "chapters")
            if new != old:
                path.write_text(new)
                changed += 1
                print("rewrote", path.relative_to(root))
    print(changed, "files")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
