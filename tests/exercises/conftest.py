"""Exercise checks. They run against `solutions/` in CI and against `exercises/` for a learner:

    make check-exercises          # your answers (MINIPAGED_ANSWERS=exercises)
    make test                     # the reference solutions (MINIPAGED_ANSWERS=solutions)

An exercise that is still a stub raises NotImplementedError; it is reported as one short line that
says which exercise and what to do, not as a traceback.
"""

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is not None and call.excinfo.errisinstance(NotImplementedError):
        report.longrepr = f"NOT SOLVED YET  {item.name}: {call.excinfo.value}"
