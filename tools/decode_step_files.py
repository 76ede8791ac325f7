"""Which files of the package one decode step of ``minipaged.LLM`` passes through.

Traces one plain decode step (every request past its prefill) with ``sys.setprofile`` and
reports, for each kernel launch, the package's files on the call stack from ``LLM.step`` down
to the launch, and for the whole step the files entered and the number of times a call crossed
from one file into another. On a CPU it runs the fast parts with Triton's interpreter
(``attention_backend="triton"``) on chapter 9's tiny model; the path is the one a GPU takes,
less CUDA graphs.

    python tools/decode_step_files.py            # a table
    python tools/decode_step_files.py --json     # the same, as JSON
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
if "--package-root" in sys.argv:  # another revision's package, for a before/after
    sys.path.insert(0, sys.argv[sys.argv.index("--package-root") + 1])

import minipaged.runtime  # noqa: E402,F401  (the CPU switch before any kernel)


def package_file(frame, package: Path) -> str | None:
    path = Path(frame.f_code.co_filename)
    try:
        return path.resolve().relative_to(package).as_posix()
    except ValueError:
        return None


def trace_one_step(llm, package: Path) -> dict:
    launches, crossings, entered = [], 0, []
    previous = None

    def on_call(frame, event, arg):
        nonlocal crossings, previous
        if event != "call":
            return
        here = package_file(frame, package)
        if here is None:
            if frame.f_code.co_name == "run" and "triton" in frame.f_code.co_filename:
                stack, f = [], frame.f_back   # a kernel launch: the package's files above it
                while f is not None:
                    name = package_file(f, package)
                    if name and (not stack or stack[-1] != name):
                        stack.append(name)
                    f = f.f_back
                launches.append(list(reversed(stack)))
            return
        caller = frame.f_back
        while caller is not None and package_file(caller, package) is None:
            caller = caller.f_back
        origin = package_file(caller, package) if caller is not None else None
        if origin is not None and origin != here:
            crossings += 1
        if here not in entered:
            entered.append(here)
        previous = here

    sys.setprofile(on_call)
    try:
        llm.step()
    finally:
        sys.setprofile(None)
    paths = sorted({tuple(p) for p in launches}, key=len)
    return {"files_entered": entered, "file_crossings": crossings,
            "kernel_launches": len(launches),
            "longest_path_to_a_kernel": list(paths[-1]) if paths else [],
            "files_on_the_longest_path": len(paths[-1]) if paths else 0,
            "paths_to_kernels": [list(p) for p in paths]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--package-root", help="a folder holding another revision's minipaged/")
    args = parser.parse_args()

    import minipaged
    try:
        from minipaged.engine.scheduler import SamplingParams
        from minipaged.model.qwen3 import random_qwen3, tiny_qwen3_config
    except ModuleNotFoundError:  # a revision from before the layout by layer
        from minipaged.qwen3 import random_qwen3, tiny_qwen3_config
        from minipaged.scheduler import SamplingParams

    package = Path(minipaged.__file__).resolve().parent
    llm = minipaged.LLM(random_qwen3(tiny_qwen3_config()), attention_backend="triton",
                        enable_cuda_graphs=False, num_blocks=32)
    params = SamplingParams(max_tokens=8, temperature=0.0)
    for prompt in ([1, 2, 3, 4, 5], [6, 7, 8]):
        llm.llm_engine.add_request(prompt, params)
    for _ in range(3):   # prefill, then decode steps until every request decodes
        llm.step()
    report = trace_one_step(llm, package)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"files entered: {len(report['files_entered'])}  file crossings: "
          f"{report['file_crossings']}  kernel launches: {report['kernel_launches']}")
    for name in report["files_entered"]:
        print("  ", name)
    print("paths from LLM.step to a kernel:")
    for path in report["paths_to_kernels"]:
        print("   " + " -> ".join(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
