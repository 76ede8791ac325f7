"""Which chapters changed since their last green GPU run.

Reads every recorded GPU run (results/gpu_run_*.json, written by tools/gpu_run.sh) and compares
each chapter's sha256 with the version that last passed every cell on a GPU.

    python tools/gpu_status.py            print a line per chapter
    python tools/gpu_status.py --strict   exit 1 if any chapter is not green on a GPU as it is now
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_runs(results: Path) -> list[dict]:
    runs = []
    for path in sorted(results.glob("gpu_run_*.json")):
        record = json.loads(path.read_text())
        if isinstance(record.get("chapters"), dict):
            runs.append(record)
    return sorted(runs, key=lambda r: r.get("date", ""))


def status(chapter: Path, runs: list[dict]) -> tuple[bool, str]:
    """(green as it is now, one line saying why)."""
    digest = hashlib.sha256(chapter.read_bytes()).hexdigest()
    seen = [(r, r["chapters"][chapter.stem]) for r in runs if chapter.stem in r["chapters"]]
    green = [(r, c) for r, c in seen if c.get("ok")]
    same = [(r, c) for r, c in seen if c.get("sha256") == digest]
    if same and same[-1][1].get("ok"):
        run, cells = same[-1]
        return True, f"green on {run['device']} {run['date'][:10]} ({cells['passed']} cells)"
    if same:
        run, cells = same[-1]
        return False, f"FAILED {cells['failed']} cell(s) on {run['device']} {run['date'][:10]}"
    if green:
        return False, f"CHANGED since its last green GPU run ({green[-1][0]['date'][:10]})"
    return False, "no per-chapter GPU record yet"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strict", action="store_true", help="exit 1 unless every chapter is green")
    parser.add_argument("--results", default=str(ROOT / "results"))
    args = parser.parse_args()
    runs = load_runs(Path(args.results))
    all_green = True
    for chapter in sorted((ROOT / "chapters").glob("[0-9][0-9]_*.md")):
        green, line = status(chapter, runs)
        all_green &= green
        print(f"{chapter.stem:24s} {line}")
    return 0 if all_green or not args.strict else 1


if __name__ == "__main__":
    sys.exit(main())
