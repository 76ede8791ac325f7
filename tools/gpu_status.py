"""Which chapters changed since their last green GPU run.

The ledger, results/gpu_status.json, holds for each chapter its latest GPU run that passed every
cell (device, date, commit, command, cells passed and failed, seconds, the sha256 of the chapter
file that passed), a failure recorded after it if there is one, and the latest compile-target
results (every Triton kernel compiled for sm75, sm80 and sm89). A GPU run of tools/gpu_run.sh
writes gpu_run_<date>.json; `--record` folds it into the ledger, replacing the chapters that run
covered and keeping the others.

    python tools/gpu_status.py                                     a line per chapter
    python tools/gpu_status.py --strict                            exit 1 unless every chapter is green
    python tools/gpu_status.py --record gpu-out/gpu_run_<date>.json   fold a run into the ledger
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LEDGER = ROOT / "results" / "gpu_status.json"
WHAT = ("For each chapter, its latest GPU run that passed every cell (tools/gpu_run.sh), with the "
        "sha256 of the chapter file that passed; 'failures': a failing run recorded after a "
        "chapter's green one; 'compile_targets': the latest run of tools/compile_targets.py. "
        "Each run's own JSON is in git history under the name in 'run'.")
UPDATED_BY = "python tools/gpu_status.py --record gpu-out/gpu_run_<date>.json"
CELLS = ("passed", "failed", "skipped", "seconds", "sha256")
PROVENANCE = ("device", "date", "command", "commit", "software", "note")


def new_ledger() -> dict:
    return {"what": WHAT, "updated_by": UPDATED_BY, "date": "", "chapters": {}, "failures": {},
            "compile_targets": {}}


def load_ledger(path: Path = LEDGER) -> dict:
    return json.loads(path.read_text()) if path.exists() else new_ledger()


def save_ledger(ledger: dict, path: Path = LEDGER) -> None:
    ledger["chapters"] = dict(sorted(ledger["chapters"].items()))
    ledger["failures"] = dict(sorted(ledger["failures"].items()))
    path.write_text(json.dumps(ledger, indent=1) + "\n")


def fold(ledger: dict, run: dict, name: str) -> dict:
    """Fold one GPU run (the JSON tools/gpu_run.sh writes, saved as ``name``) into ``ledger``.

    A chapter that passed replaces its entry unless the ledger already holds a later green run;
    a chapter that failed is kept under 'failures' while no later green run exists. Chapters the
    run did not cover are left as they are.
    """
    missing = [k for k in ("device", "date", "command") if not run.get(k)]
    if missing or not isinstance(run.get("chapters"), dict):
        raise ValueError(f"{name}: not a per-chapter GPU run (missing {missing or ['chapters']})")
    header = {k: run[k] for k in PROVENANCE if run.get(k)}
    header["run"] = name
    for stem, cells in run["chapters"].items():
        entry = {**header, **{k: cells[k] for k in CELLS if k in cells}}
        green = ledger["chapters"].get(stem)
        if cells.get("ok"):
            if green is None or green["date"] <= entry["date"]:
                ledger["chapters"][stem] = entry
                failure = ledger["failures"].get(stem)
                if failure is not None and failure["date"] <= entry["date"]:
                    del ledger["failures"][stem]
        elif green is None or green["date"] < entry["date"]:
            failure = ledger["failures"].get(stem)
            if failure is None or failure["date"] <= entry["date"]:
                ledger["failures"][stem] = entry
    targets = run.get("compile_targets")
    if isinstance(targets, dict) and targets.get("kernels"):
        if ledger["compile_targets"].get("date", "") <= run["date"]:
            ledger["compile_targets"] = {**header, "triton": targets.get("triton"),
                                         "kernels": targets["kernels"]}
    ledger["date"] = max(ledger.get("date", ""), run["date"])
    return ledger


def status(chapter: Path, ledger: dict) -> tuple[bool, str]:
    """(green as it is now, one line saying why)."""
    digest = hashlib.sha256(chapter.read_bytes()).hexdigest()
    green = ledger["chapters"].get(chapter.stem)
    failure = ledger.get("failures", {}).get(chapter.stem)
    if failure is not None and failure.get("sha256") == digest:
        return False, f"FAILED {failure['failed']} cell(s) on {failure['device']} {failure['date'][:10]}"
    if green is not None and green.get("sha256") == digest:
        skipped = (f", {green['skipped']} skipped: no real model there"
                   if green.get("skipped") else "")
        return True, (f"green on {green['device']} {green['date'][:10]} "
                      f"({green['passed']} cells{skipped})")
    if green is not None:
        return False, f"CHANGED since its last green GPU run ({green['date'][:10]})"
    if failure is not None:
        return False, f"never green on a GPU (an earlier version FAILED {failure['date'][:10]})"
    return False, "no per-chapter GPU record yet"


def compile_line(ledger: dict) -> str | None:
    targets = ledger.get("compile_targets") or {}
    kernels = {k: v for k, v in targets.get("kernels", {}).items() if "inlined into" not in v}
    if not kernels:
        return None
    bad = [f"{k} {t}: {v[t]}" for k, v in kernels.items() for t in ("sm75", "sm80", "sm89")
           if not str(v.get(t, "missing")).startswith(("ok", "n/a"))]
    verdict = "; ".join(bad) if bad else "all compile (or n/a: no FP8 before sm89)"
    return (f"{len(kernels)} kernels for sm75/sm80/sm89 on {targets['date'][:10]} at "
            f"{targets.get('commit', '?')}: {verdict}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strict", action="store_true", help="exit 1 unless every chapter is green")
    parser.add_argument("--record", nargs="+", metavar="RUN_JSON",
                        help="fold these GPU runs (gpu_run_<date>.json) into the ledger first")
    parser.add_argument("--ledger", default=str(LEDGER), help="the ledger (results/gpu_status.json)")
    parser.add_argument("--chapters", default=str(ROOT / "chapters"))
    args = parser.parse_args(argv)
    ledger_path = Path(args.ledger)
    ledger = load_ledger(ledger_path)
    if args.record:
        runs = [(json.loads(Path(p).read_text()), Path(p).name) for p in args.record]
        for run, name in sorted(runs, key=lambda r: r[0].get("date", "")):
            fold(ledger, run, name)
            print(f"recorded {name} ({', '.join(run['chapters']) or 'no chapters'})")
        save_ledger(ledger, ledger_path)
    all_green = True
    for chapter in sorted(Path(args.chapters).glob("[0-9][0-9]_*.md")):
        green, line = status(chapter, ledger)
        all_green &= green
        print(f"{chapter.stem:24s} {line}")
    line = compile_line(ledger)
    if line:
        print(f"{'compile targets':24s} {line}")
    return 0 if all_green or not args.strict else 1


if __name__ == "__main__":
    sys.exit(main())
