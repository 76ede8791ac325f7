"""Chapter 0: the one switch between CPU and GPU, and where recorded measurements are found."""

import json

import torch

from minipaged.runtime import (by_device, default_device, has_gpu, results_path,
                               uses_triton_interpreter)


def test_device_follows_torch():
    assert has_gpu() == torch.cuda.is_available()
    assert default_device().type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert by_device(cpu=1, gpu=2) == (2 if has_gpu() else 1)


def test_interpreter_reads_the_environment_when_asked(monkeypatch):
    for value, expected in (("1", True), ("0", False), ("", False)):
        monkeypatch.setenv("TRITON_INTERPRET", value)
        assert uses_triton_interpreter() is expected
    monkeypatch.delenv("TRITON_INTERPRET")
    assert uses_triton_interpreter() is False


def test_results_path_finds_the_repository_copy_from_anywhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                       # not the repository root
    path = results_path("gpu_run_chapters_00-06_h200.json")
    assert path.is_absolute() and path.exists()
    assert {"device", "date", "command"} <= json.loads(path.read_text()).keys()
    missing = results_path("no_such_run.json")        # not recorded: the notebook-relative fallback
    assert str(missing) == "results/no_such_run.json" and not missing.exists()
