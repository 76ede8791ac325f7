"""The CI workflow (.github/workflows/ci.yml), read as GitHub would run it for a push to main, a
push elsewhere and a pull request: pip's cache on every set-up Python, the chapters executed once
per run (on main by the book build, whose site the deploy job publishes as it is), a Pages deploy
that nothing cancels, and the self-hosted GPU job only where the repository variable says such a
runner exists.

A job's or step's `if:` is evaluated here for each event: the workflow uses only `==`, `!=`,
`&&`, `||`, `always()`, quoted strings and the names below, which this file turns into Python
(anything else fails the test, so a new kind of condition is noticed rather than misread)."""

import re
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "ci.yml"

EVENTS = {
    "push to main": {"github.event_name": "push", "github.ref": "refs/heads/main"},
    "push to a branch": {"github.event_name": "push", "github.ref": "refs/heads/topic"},
    "pull request": {"github.event_name": "pull_request", "github.ref": "refs/pull/7/merge"},
}
NO_GPU_RUNNER = {"vars.GPU_RUNNER": ""}          # a fork: the variable is not set
GPU_RUNNER = {"vars.GPU_RUNNER": "true"}

# a step that executes every chapter (nbval, the book build, the GPU runner)
EXECUTES_CHAPTERS = re.compile(r"make (test|test-chapters|book|gpu-test)\b|run_chapters\.py|"
                               r"jupyter-book build|browser-check")


@pytest.fixture(scope="module")
def workflow():
    return yaml.safe_load(WORKFLOW.read_text())


def evaluate(expression, context: dict) -> bool:
    """GitHub's value of an `if:` (or `${{ }}`) expression in ``context``; no condition is true."""
    if expression is None:
        return True
    if isinstance(expression, bool):
        return expression
    text = str(expression).strip()
    text = text.removeprefix("${{").removesuffix("}}").strip()
    tokens = re.findall(r"always\(\)|'[^']*'|[\w.]+|==|!=|&&|\|\||[()]|\S", text)
    python = []
    for token in tokens:
        if token in context:
            python.append(repr(context[token]))
        elif token == "always()":             # a step that runs even after a failure
            python.append("True")
        elif token.startswith("'") or token in ("==", "!=", "(", ")"):
            python.append(token)
        elif token in ("&&", "||"):
            python.append({"&&": "and", "||": "or"}[token])
        else:
            raise AssertionError(f"unknown term {token!r} in the condition {expression!r}")
    return bool(eval(" ".join(python), {"__builtins__": {}}))


def steps_run(job: dict, context: dict) -> list[dict]:
    return [step for step in job.get("steps", []) if evaluate(step.get("if"), context)]


def jobs_run(workflow: dict, context: dict) -> dict[str, dict]:
    return {name: job for name, job in workflow["jobs"].items()
            if evaluate(job.get("if"), context)}


def chapter_runs(workflow: dict, context: dict) -> list[str]:
    return [f"{name}: {step.get('name', step.get('run'))}"
            for name, job in jobs_run(workflow, context).items()
            for step in steps_run(job, context)
            if EXECUTES_CHAPTERS.search(step.get("run", ""))]


def test_the_condition_reader_is_not_vacuous():
    main = {**EVENTS["push to main"], **NO_GPU_RUNNER}
    assert evaluate("github.ref == 'refs/heads/main' && github.event_name == 'push'", main)
    assert not evaluate("${{ github.ref != 'refs/heads/main' }}", main)
    assert evaluate("vars.GPU_RUNNER == 'true' || github.event_name == 'push'", main)
    with pytest.raises(AssertionError):
        evaluate("contains(github.ref, 'main')", main)


def test_every_python_set_up_caches_pip(workflow):
    setups = [step for job in workflow["jobs"].values() for step in job.get("steps", [])
              if str(step.get("uses", "")).startswith("actions/setup-python")]
    assert setups
    for step in setups:
        assert step["with"].get("cache") == "pip", step
        paths = step["with"].get("cache-dependency-path", "").split()
        assert "pyproject.toml" in paths and "requirements/cpu.txt" in paths, step


@pytest.mark.parametrize("event", EVENTS)
@pytest.mark.parametrize("gpu", [NO_GPU_RUNNER, GPU_RUNNER], ids=["no-gpu-runner", "gpu-runner"])
def test_the_chapters_run_once_on_the_cpu_per_event(workflow, event, gpu):
    context = {**EVENTS[event], **gpu}
    runs = [run for run in chapter_runs(workflow, context) if not run.startswith("gpu:")]
    assert len(runs) == 1, runs


def test_on_main_the_book_build_is_the_chapter_run_and_its_site_is_deployed(workflow):
    context = {**EVENTS["push to main"], **NO_GPU_RUNNER}
    jobs = jobs_run(workflow, context)
    (run,) = chapter_runs(workflow, context)
    builder = run.split(":")[0]
    built = steps_run(jobs[builder], context)
    assert any("make book" in step.get("run", "") for step in built), run
    uploads = [s for s in built if str(s.get("uses", "")).startswith("actions/upload-pages-artifact")]
    assert len(uploads) == 1 and uploads[0]["with"]["path"] == "_build/html"
    (deployer,) = [name for name, job in jobs.items()
                   if any(str(s.get("uses", "")).startswith("actions/deploy-pages")
                          for s in job.get("steps", []))]
    needs = jobs[deployer].get("needs", [])
    assert builder in ([needs] if isinstance(needs, str) else needs)
    # the deploy job publishes what was built; it executes nothing itself
    assert not any("run" in step for step in jobs[deployer]["steps"]), jobs[deployer]["steps"]
    # and the book is built with cells that raise failing it, as nbval would
    config = yaml.safe_load((ROOT / "_config.yml").read_text())["execute"]
    assert config.get("raise_on_error") is True and config.get("allow_errors") is False


def test_no_pages_deploy_is_cancelled_halfway(workflow):
    context = {**EVENTS["push to main"], **NO_GPU_RUNNER}
    top = workflow.get("concurrency", {})
    assert not evaluate(top.get("cancel-in-progress", False), context)
    for other in ("push to a branch", "pull request"):    # elsewhere a newer push does cancel
        assert evaluate(top.get("cancel-in-progress", False), {**EVENTS[other], **NO_GPU_RUNNER})
    deployers = [job for job in workflow["jobs"].values()
                 if any(str(s.get("uses", "")).startswith("actions/deploy-pages")
                        for s in job.get("steps", []))]
    assert len(deployers) == 1
    concurrency = deployers[0]["concurrency"]
    assert concurrency["group"] and concurrency.get("cancel-in-progress") is False


@pytest.mark.parametrize("event", EVENTS)
def test_the_gpu_job_runs_only_where_a_runner_is_declared(workflow, event):
    (gpu_jobs,) = [[name for name, job in workflow["jobs"].items()
                    if "self-hosted" in job.get("runs-on", [])]]
    assert gpu_jobs
    for name in gpu_jobs:
        assert name not in jobs_run(workflow, {**EVENTS[event], **NO_GPU_RUNNER})
    declared = jobs_run(workflow, {**EVENTS[event], **GPU_RUNNER})
    # a pull request (perhaps from a fork) never reaches the self-hosted runner
    assert all((name in declared) == (event != "pull request") for name in gpu_jobs)
