"""Record the numbers a chapter glues into its prose, for the Colab twins: notebooks/glued/NN_name.json.

The book fills ``{glue:text}`name:fmt``` in from the chapter it has just executed. A Colab twin has
no outputs, so ``tools/export.py`` writes the values of a recorded run into the twin's Markdown
instead (``tools/colab_twin.py``). This tool makes that record: per chapter, every value a
``glue(name, value)`` call produced, as myst-nb stored it (its ``text/plain``, which the twin
formats the way myst-nb does), with the device and the date of the run::

    python tools/record_glued_values.py --jobs 2 03 11   # execute chapters 3 and 11, record them
    python tools/record_glued_values.py --from-book      # every chapter, from `make book`'s cache

By default the chapters are executed here, the way the book executes them (jupyter-cache's
executor, in ``chapters/``, myst-nb's ``glue``). ``--from-book`` reads the executed notebooks of
the book's execution cache (``_build/.jupyter_cache``) instead, and skips a chapter whose code
changed since that run. A glued figure records no value (the twin keeps its caption).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = ROOT / "chapters"
RECORDS = ROOT / "notebooks" / "glued"
GLUE_PREFIX = "application/papermill.record/"


def device() -> str:
    """The device this machine runs a chapter on, as the chapters pick it (a GPU if present)."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except ImportError:
        pass
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [l.split(":", 1)[1].strip() for l in cpuinfo.read_text().splitlines()
                 if l.startswith("model name")]
        model = names[0] if names else model
    return f"CPU ({model}, {os.cpu_count()} cores)"


def glued_values(notebook) -> dict[str, str]:
    """``name -> text/plain`` of every value glued by a code cell (a figure records nothing)."""
    values: dict[str, str] = {}
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        for output in cell.get("outputs", []):
            name = (output.get("metadata") or {}).get("scrapbook", {}).get("name")
            if not name or output.get("output_type") not in ("display_data", "execute_result"):
                continue
            data = {k.removeprefix(GLUE_PREFIX): v for k, v in output.get("data", {}).items()}
            if any(k.startswith("image/") for k in data) or "text/plain" not in data:
                values.pop(name, None)
                continue
            text = data["text/plain"]
            values[name] = "".join(text) if isinstance(text, list) else text
    return values


def record(chapter: Path, values: dict[str, str], device_name: str, date: str, how: str) -> Path:
    """Write the record of ``chapter`` (none where it glues nothing)."""
    RECORDS.mkdir(parents=True, exist_ok=True)
    path = RECORDS / f"{chapter.stem}.json"
    if not values:
        path.unlink(missing_ok=True)
        return path
    path.write_text(json.dumps({
        "chapter": f"chapters/{chapter.name}",
        "device": device_name,
        "date": date,
        "how": how,
        "values": dict(sorted(values.items())),
    }, indent=1, ensure_ascii=False) + "\n")
    return path


def execute(chapter: Path) -> tuple[Path, dict[str, str] | str, float]:
    """Run one chapter as the book does; its glued values, or the error."""
    from jupyter_cache.executors.utils import single_nb_execution
    from myst_nb.core.read import read_myst_markdown_notebook

    notebook = read_myst_markdown_notebook(chapter.read_text())
    result = single_nb_execution(notebook, cwd=str(CHAPTERS), timeout=900, allow_errors=False)
    if result.err is not None:
        return chapter, f"{type(result.err).__name__}: {str(result.err)[-2000:]}", result.time
    return chapter, glued_values(notebook), result.time


def _code(notebook) -> list[str]:
    """The code cells' sources, less the cell the book appends with the hashes of the results/
    files a chapter reads (``_ext/results_inputs.py``)."""
    return [c.source.strip() for c in notebook.cells if c.cell_type == "code"
            and not c.source.startswith("# The recorded results this chapter reads")]


def from_book(chapter: Path, cache_dir: Path) -> tuple[dict[str, str] | str, str]:
    """The glued values of the book's last execution of ``chapter``, and its date."""
    from jupyter_cache import get_cache
    from myst_nb.core.read import read_myst_markdown_notebook

    cache = get_cache(str(cache_dir))
    records = [r for r in cache.list_cache_records() if Path(r.uri).resolve() == chapter.resolve()]
    if not records:
        return "not in the book's execution cache (run `make book`)", ""
    latest = max(records, key=lambda r: r.created)
    executed = cache.get_cache_bundle(latest.pk).nb
    current = _code(read_myst_markdown_notebook(chapter.read_text()))
    cached = _code(executed)
    if current != cached:
        return "its code changed since the book's last run (run `make book` again)", ""
    return glued_values(executed), latest.created.strftime("%Y-%m-%d")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", help="number prefixes, e.g. 03 11 (default: all)")
    parser.add_argument("--jobs", type=int, default=2, help="chapters executed in parallel")
    parser.add_argument("--from-book", nargs="?", const=str(ROOT / "_build" / ".jupyter_cache"),
                        metavar="CACHE", help="read the book's execution cache instead of running")
    args = parser.parse_args()
    chapters = sorted(CHAPTERS.glob("[0-9][0-9]_*.md"))
    if args.chapters:
        chapters = [c for c in chapters if c.name[:2] in set(args.chapters)]
    if not chapters:
        print("no chapter matches", args.chapters, file=sys.stderr)
        return 2
    here = device()
    failed = 0
    if args.from_book:
        for chapter in chapters:
            values, date = from_book(chapter, Path(args.from_book))
            if isinstance(values, str):
                print(f"{chapter.stem}: not recorded: {values}", file=sys.stderr)
                failed += 1
                continue
            path = record(chapter, values, here, date,
                          "make book's execution, read by tools/record_glued_values.py --from-book")
            print(f"{chapter.stem}: {len(values)} values -> {path.relative_to(ROOT)}")
        return 1 if failed else 0
    today = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    print(f"executing {len(chapters)} chapter(s) on {here}", flush=True)
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for chapter, values, seconds in pool.map(execute, chapters):
            if isinstance(values, str):
                print(f"{chapter.stem}: FAILED after {seconds:.0f} s, not recorded: {values}",
                      file=sys.stderr)
                failed += 1
                continue
            path = record(chapter, values, here, today, "executed by tools/record_glued_values.py")
            print(f"{chapter.stem}: {len(values)} values in {seconds:.0f} s -> "
                  f"{path.relative_to(ROOT)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
