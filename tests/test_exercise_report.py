"""The learner's exercise report (tools/exercise_report.py, `make check-exercises`) on chapter 1:
untouched stubs are "not yet" and exit 0; a wrong answer is WRONG, with its check and what it got,
and exits 1; an answers file that does not import is WRONG too."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "tools" / "exercise_report.py"
CH01 = "ch01_kv_sizing.py"


def report(*args):
    result = subprocess.run([sys.executable, str(REPORT), *args], capture_output=True, text=True,
                            timeout=300, cwd=ROOT)
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, result.stdout


def test_untouched_stubs_are_not_yet_and_exit_0():
    code, out = report("--answers", "exercises", "1")
    assert code == 0, out
    assert "Chapter 1. How big is the KV cache?" in out and "Chapter 3" not in out
    assert "0 of 4 solved" in out and "WRONG" not in out
    # the stub's message says what to do, and where
    assert "1.3   not yet  return how many requests fit in the budget" in out
    assert "edit exercises/ch01_kv_sizing.py, max_concurrent_requests" in out
    assert "0 of 4 exercises solved, 4 not yet, 0 wrong.  Next: exercise 1.1." in out
    assert "planted" not in out   # the checkers' self-tests are not in the learner's report


def test_every_chapters_untouched_stubs_load_and_are_not_yet():
    """The checkout a learner starts from: every stub file imports, and nothing is solved or wrong."""
    code, out = report("--answers", "exercises")
    stubs = len(list((ROOT / "exercises").glob("ch[0-9][0-9]_*.py")))
    assert code == 0 and "do not load" not in out and "WRONG" not in out, out
    assert stubs >= 17 and "0 of 45 exercises solved, 45 not yet, 0 wrong." in out, out


def test_solutions_are_solved():
    code, out = report("--answers", "solutions", "01")
    assert code == 0, out
    assert "4 of 4 exercises solved, 0 not yet, 0 wrong.  All done." in out


def test_a_wrong_answer_is_an_error_with_a_hint(tmp_path):
    answers = (ROOT / "solutions" / CH01).read_text()
    answers += ("\n\ndef max_concurrent_requests(*args, **kwargs):\n    return 0\n"
                "\n\ndef audit_max_blocks(max_blocks):\n"
                "    raise NotImplementedError('Exercise 1.2: probe max_blocks with budgets you "
                "choose (edit exercises/ch01_kv_sizing.py, audit_max_blocks)')\n")
    (tmp_path / CH01).write_text(answers)
    code, out = report("--answers", str(tmp_path), "1")
    assert code == 1, out
    lines = out.splitlines()
    assert any(line.startswith("  1.1   solved") for line in lines), out
    wrong = lines.index(next(line for line in lines if line.startswith("  1.3   WRONG")))
    assert "max_concurrent_requests" in lines[wrong]
    assert ("check test_1_3_max_concurrent_requests  (tests/exercises/test_ch01_kv_sizing.py:"
            in lines[wrong + 1])
    assert "ex.max_concurrent_requests(" in lines[wrong + 2]         # the check: what was expected
    assert lines[wrong + 3].strip().startswith("got   assert 0 ==")  # what it got
    assert any(line.startswith("  1.2   not yet  probe max_blocks with budgets you choose")
               for line in lines)
    assert ("2 of 4 exercises solved, 1 not yet, 1 wrong.  "
            "Fix the WRONG ones first (exit status 1).") in out


def test_an_answers_file_that_does_not_import_is_an_error(tmp_path):
    (tmp_path / CH01).write_text("def block_growth(:\n")
    code, out = report("--answers", str(tmp_path), "1")
    assert code == 1, out
    assert f"{tmp_path / CH01} does not load" in out and "SyntaxError" in out

