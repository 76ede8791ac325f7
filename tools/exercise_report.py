"""Your exercise report: per chapter, each exercise solved, not yet, or wrong, with a hint.

    make check-exercises              # every chapter (this script, on your answers in exercises/)
    make check-exercises CH=03        # one chapter; CH="03 05" for two
    python tools/exercise_report.py [--answers exercises|solutions|/abs/folder] [-v] [03 05 ...]

It runs the checks in tests/exercises/ under pytest and sorts what they say by exercise (a test
named test_3_2_... checks exercise 3.2):

  solved   every check of the exercise passes;
  not yet  a check reached a stub that still raises NotImplementedError: its message says what to
           do and where;
  WRONG    a check failed (or your code raised, or your file does not import): the report shows the
           check that failed, what it got, and the function to look at.

The exit status is 0 while nothing is wrong, however much is not yet solved; 1 when an answer is
wrong. The checkers' self-tests (tests marked `grader`: planted bugs that a check must reject) do
not look at your answers and are left out; `make test` runs them.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import sys
import textwrap
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests" / "exercises"
TEST_NAME = re.compile(r"test_(\d+)_(\d+)_")
STUB_MESSAGE = re.compile(r"\s*(?:Exercise (\d+\.\d+):\s*)?(.*?)\s*(?:\((edit [^)]*)\))?\s*$",
                          re.DOTALL)
WIDTH = 100
INDENT = 17   # where an exercise's message starts: "  3.2   not yet  "


@dataclass
class Check:
    """One test's outcome: passed, not yet (a stub), wrong, or skipped."""
    name: str
    status: str
    message: str = ""
    where: str = ""       # the line of the check (or of your code) the failure points at
    statement: str = ""   # that line's source


@dataclass
class Exercise:
    number: str
    checks: list[Check] = field(default_factory=list)

    @property
    def status(self) -> str:
        states = {c.status for c in self.checks} - {"skipped"}
        if "wrong" in states:
            return "wrong"
        if "not yet" in states:
            return "not yet"
        return "solved" if states else "skipped"


def _short(text: str, lines: int = 4) -> str:
    """The first lines of a message, without object addresses, each cut to the report's width."""
    text = re.sub(r" at 0x[0-9a-f]+", "", text)
    text = re.sub(r"<module '(\w+)' from '[^']*'>", r"\1", text)
    kept = [line.rstrip() for line in text.strip("\n").splitlines() if line.strip()][:lines]
    return "\n".join(line if len(line) <= WIDTH else line[:WIDTH - 3] + "..." for line in kept)


def _locate(excinfo, folder: Path) -> tuple[str, str]:
    """The innermost traceback entry in `folder`: ("path:line", source of the statement)."""
    for entry in reversed(excinfo.traceback):
        path = Path(str(entry.path))
        if path.is_relative_to(folder):
            try:
                statement = str(entry.statement).strip().splitlines()[0]
            except Exception:  # no source (a generated function)
                statement = ""
            shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            return f"{shown}:{entry.lineno + 1}", statement
    return "", ""


class Collector:
    """A pytest plugin that keeps, per test, what the report needs."""

    def __init__(self, answers: Path):
        self.answers = answers
        self.checks: dict[str, list[Check]] = defaultdict(list)   # test file stem -> checks
        self.broken: dict[str, str] = {}     # test file stem -> why its answers did not load

    def _stem(self, nodeid: str) -> str:
        return Path(nodeid.split("::")[0]).stem

    def pytest_collectreport(self, report):
        if report.failed:   # the error itself: pytest's "E   " lines, else the last lines
            text = str(report.longrepr).splitlines()
            error = [line[1:] for line in text if line.startswith("E ")] or text[-6:]
            self.broken[self._stem(report.nodeid)] = _short(textwrap.dedent("\n".join(error)), 6)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        if report.when == "call" and report.passed:
            self.checks[self._stem(item.nodeid)].append(Check(item.name, "passed"))
        elif report.skipped and report.when in ("setup", "call"):
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else ""
            self.checks[self._stem(item.nodeid)].append(Check(item.name, "skipped", reason))
        elif report.failed and call.excinfo is not None:
            excinfo = call.excinfo
            if excinfo.errisinstance(NotImplementedError):
                check = Check(item.name, "not yet", str(excinfo.value))
            else:
                where, statement = _locate(excinfo, TESTS)
                mine, my_statement = _locate(excinfo, self.answers)
                message = str(excinfo.value) or excinfo.typename
                if not excinfo.errisinstance(AssertionError) and excinfo.typename != "Failed":
                    message = f"{excinfo.typename}: {message}"
                    if mine:   # your code raised: point at your line
                        where, statement = mine, my_statement
                check = Check(item.name, "wrong", _short(message), where, statement)
            self.checks[self._stem(item.nodeid)].append(check)


def _not_yet(number: str, message: str, shown: str, look: str | None) -> list[str]:
    """Two lines: what to do, and where. A stub's message reads "Exercise 3.2: what to do (edit
    file, name)"; a check that first reaches another exercise's stub waits on that one."""
    stub = STUB_MESSAGE.match(message)
    of, task, edit = stub.groups() if stub else (None, message, None)
    task = " ".join(task.split())
    if not edit and look:   # "... (check_rope)": the name goes on the "edit" line
        task = re.sub(r"\s*\([\w.,\s]+\)$", "", task)
    where = edit or (f"edit {shown}, {look}" if look else f"edit {shown}")
    if of and of != number:
        return [f"  {number:<5} {'not yet':<8} its checks need exercise {of} first: {task}",
                f"{'':{INDENT}}{where}"]
    task = task if len(task) <= WIDTH - INDENT else task[:WIDTH - INDENT - 3] + "..."
    return [f"  {number:<5} {'not yet':<8} {task}", f"{'':{INDENT}}{where}"]


def chapter_titles() -> dict[str, str]:
    titles = {}
    for path in sorted((ROOT / "chapters").glob("[0-9][0-9]_*.md")):
        for line in path.read_text().splitlines():
            if line.startswith("# "):
                titles[path.name[:2]] = line[2:].strip()
                break
    return titles


def exercise_targets(answers_file: Path) -> dict[str, str]:
    """Exercise number -> the functions or methods of `answers_file` whose docstring names it."""
    targets: dict[str, list[str]] = defaultdict(list)
    try:
        tree = ast.parse(answers_file.read_text())
    except (OSError, SyntaxError):
        return {}

    def visit(node, prefix=""):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                match = re.match(r"\s*Exercise (\d+\.\d+)", ast.get_docstring(child) or "")
                if match:
                    targets[match.group(1)].append(name)
                if isinstance(child, ast.ClassDef):
                    visit(child, name + ".")

    visit(tree)
    return {number: ", ".join(names) for number, names in targets.items()}


def run_checks(chapters: list[str], answers: str) -> Collector:
    os.environ["MINIPAGED_ANSWERS"] = answers
    from tests.exercises.answers import answers_dir
    collector = Collector(answers_dir())
    files = sorted(str(p) for p in TESTS.glob("test_ch[0-9][0-9]_*.py")
                   if not chapters or p.name[7:9] in chapters)
    if not files:
        raise SystemExit(f"no exercise checks for chapter(s) {' '.join(chapters)} in {TESTS}")
    args = ["-p", "no:terminal", "-p", "no:randomly", "--continue-on-collection-errors",
            "-m", "not grader", "-W", "ignore", *files]
    code = pytest.main(args, plugins=[collector])
    if code not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED,
                    pytest.ExitCode.NO_TESTS_COLLECTED):
        raise SystemExit(f"pytest could not run the checks (exit {int(code)}): "
                         f"python -m pytest {' '.join(args[2:])}")
    collector.files = [Path(f).stem for f in files]
    return collector


def report(collector: Collector, verbose: bool = False) -> tuple[str, int]:
    titles = chapter_titles()
    lines, totals = [], defaultdict(int)
    next_up = None
    for stem in collector.files:
        chapter = stem[7:9]
        answers_name = stem[len("test_"):] + ".py"
        answers_file = collector.answers / answers_name
        shown = f"{collector.answers.relative_to(ROOT)}/{answers_name}" \
            if collector.answers.is_relative_to(ROOT) else str(answers_file)
        title = titles.get(chapter, stem)
        if stem in collector.broken:
            totals["broken"] += 1
            lines += [f"Chapter {title}", f"  WRONG    {shown} does not load, so none of its "
                      "exercises can be checked:"]
            lines += [f"{'':{INDENT}}{line}" for line in collector.broken[stem].splitlines()]
            lines.append("")
            continue
        exercises: dict[str, Exercise] = {}
        for check in collector.checks.get(stem, []):
            match = TEST_NAME.match(check.name)
            number = f"{match.group(1)}.{match.group(2)}" if match else "?"
            exercises.setdefault(number, Exercise(number)).checks.append(check)
        order = sorted(exercises.values(), key=lambda e: tuple(int(x) for x in e.number.split(".")
                                                               if x.isdigit()))
        counts = defaultdict(int)
        for exercise in order:
            counts[exercise.status] += 1
            totals[exercise.status] += 1
        summary = f"{counts['solved']} of {len(order)} solved"
        if counts["wrong"]:
            summary += f", {counts['wrong']} wrong"
        lines.append(f"Chapter {title}".ljust(WIDTH - len(summary) - 2) + "  " + summary)
        # what to look at: from your file's docstrings, else from the stubs' and solutions'
        targets = {**exercise_targets(ROOT / "solutions" / answers_name),
                   **exercise_targets(ROOT / "exercises" / answers_name),
                   **exercise_targets(answers_file)}
        for exercise in order:
            status = exercise.status
            label = {"wrong": "WRONG"}.get(status, status)
            head = f"  {exercise.number:<5} {label:<8}"
            if status == "solved" or status == "skipped":
                extra = f" ({len(exercise.checks)} checks)" if verbose else ""
                reason = next((c.message for c in exercise.checks if c.status == "skipped"), "")
                lines.append(head.rstrip() + extra + (f"  {reason}" if status == "skipped" else ""))
            elif status == "not yet":
                first = next(c for c in exercise.checks if c.status == "not yet")
                lines += _not_yet(exercise.number, first.message, shown,
                                  targets.get(exercise.number))
                next_up = next_up or (exercise.number, first.message)
            else:
                failed = [c for c in exercise.checks if c.status == "wrong"]
                first = failed[0]
                look = targets.get(exercise.number)
                lines.append(f"{head} look at {shown}" + (f", {look}" if look else ""))
                where = f"  ({first.where})" if first.where else ""
                lines.append(f"{'':{INDENT}}check {first.name}{where}")
                if first.statement:
                    lines.append(f"{'':{INDENT}}  {first.statement}")
                got = first.message.splitlines()
                # `assert problem is None, problem` says its message twice: keep the first
                got = got[:1] + [line for line in got[1:] if got[0] not in line]
                for i, line in enumerate(got):
                    lines.append(f"{'':{INDENT}}{'got   ' if i == 0 else '      '}{line}")
                passed = sum(c.status == "passed" for c in exercise.checks)
                if len(exercise.checks) > 1:
                    lines.append(f"{'':{INDENT}}{len(failed)} of {len(exercise.checks)} checks fail"
                                 + (f", {passed} pass" if passed else ""))
        lines.append("")
    total = sum(totals[s] for s in ("solved", "not yet", "wrong"))
    verdict = (f"{totals['solved']} of {total} exercises solved, {totals['not yet']} not yet, "
               f"{totals['wrong']} wrong.")
    if totals["broken"]:
        verdict = verdict[:-1] + f"; {totals['broken']} answers file(s) do not load."
    if totals["wrong"] or totals["broken"]:
        verdict += "  Fix the WRONG ones first (exit status 1)."
    elif next_up:
        verdict += f"  Next: exercise {next_up[0]}."
    else:
        verdict += "  All done."
    lines.append(verdict)
    return "\n".join(lines), int(totals["wrong"] + totals["broken"] > 0)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", help="chapter numbers (03 or 3); default: all")
    parser.add_argument("--answers", default=os.environ.get("MINIPAGED_ANSWERS", "exercises"),
                        help="exercises (yours, the default), solutions, or an absolute path")
    parser.add_argument("-v", "--verbose", action="store_true", help="count the checks solved")
    args = parser.parse_args(argv)
    chapters = [c for part in args.chapters for c in part.replace(",", " ").split()]
    if not all(c.isdigit() for c in chapters):
        parser.error(f"chapters are numbers (CH=03 or CH=\"03 05\"), not {' '.join(chapters)!r}")
    chapters = [f"{int(c):02d}" for c in chapters]
    sys.path.insert(0, str(ROOT))
    os.chdir(ROOT)
    print(f"Checking the answers in {args.answers}/ (chapters: {' '.join(chapters) or 'all'})\n",
          flush=True)
    text, status = report(run_checks(chapters, args.answers), args.verbose)
    print(text)
    return status


if __name__ == "__main__":
    sys.exit(main())
