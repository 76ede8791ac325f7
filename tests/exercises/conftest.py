"""Exercise checks. They run against `solutions/` in CI and against `exercises/` for a learner:

    make check-exercises          # your answers: the report of tools/exercise_report.py
    make check-exercises CH=03    # one chapter
    make test                     # the reference solutions (MINIPAGED_ANSWERS=solutions)

An exercise that is still a stub raises NotImplementedError; it is reported as one short line that
says which exercise and what to do, not as a traceback.

Tests marked `grader` are the checkers' own self-tests (a planted bug must fail the check, a correct
reference must pass it); they do not look at your answers, so the learner's report leaves them out
(`-m "not grader"`) and `make test` runs them.
"""

import pytest


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "grader: a self-test of an exercise's checker (planted bugs, a correct "
                   "reference); independent of the answers, left out of the learner's report")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is not None and call.excinfo.errisinstance(NotImplementedError):
        report.longrepr = f"NOT SOLVED YET  {item.name}: {call.excinfo.value}"
