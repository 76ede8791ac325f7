"""`minipaged serve` (chapter 17) as a process: it says where it listens, serves, and exits 0 on
SIGTERM, with one API server process or several sharing the engine core; without its packages
it says what to install."""

import importlib.util
import os
import signal
import subprocess
import sys
import time

import pytest

from minipaged.entrypoints import cli
from benchmarks import serve_soak
from tests.serving import free_port

httpx = pytest.importorskip("httpx")


TINY = ("--num-gpu-blocks-override", "64", "--block-size", "4", "--max-model-len", "64")


def start_serve(model: str = "random:tiny", options=TINY) -> tuple[subprocess.Popen, str]:
    """``minipaged serve model`` (by default the tiny random model, with a small pool) in a
    process of its own, once it answers /health: the process and its URL."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(cli.Path(__file__).parent.parent)}
    process = subprocess.Popen(
        [sys.executable, "-m", "minipaged", "serve", model, "--port", str(port), *options],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 240
    while True:
        if process.poll() is not None:
            raise AssertionError(process.stdout.read())
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError("the server did not come up")
        time.sleep(0.5)


def test_serve_answers_then_exits_cleanly_on_sigterm():
    process, url = start_serve()
    try:
        answer = httpx.post(url + "/v1/completions", timeout=120, json={
            "model": "random:tiny", "prompt": [1, 2, 3], "max_tokens": 2, "temperature": 0}).json()
        assert answer["usage"]["completion_tokens"] == 2
        children = serve_soak.children(process.pid)
        assert children, "the engine core runs in a child process"
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
        assert not lingering(children), "a child outlived the server"
        assert f"{url}/v1" in process.stdout.read()
    finally:
        if process.poll() is None:
            process.kill()


def test_two_api_server_processes_share_one_core_and_exit_cleanly_on_sigterm():
    process, url = start_serve(options=(*TINY, "--api-server-count", "2"))
    try:
        spawned = [pid for pid in serve_soak.children(process.pid) if b"multiprocessing.spawn"
                   in cli.Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert len(spawned) == 2, "the engine core and a second API server process"
        for i in range(8):  # a new connection each: either process may accept it
            answer = httpx.post(url + "/v1/completions", timeout=120, json={
                "model": "random:tiny", "prompt": [1, 2, 3 + i], "max_tokens": 2,
                "temperature": 0})
            assert answer.json()["usage"]["completion_tokens"] == 2
        metrics = httpx.get(url + "/metrics", timeout=30).text  # kept in the core: all 8
        assert 'request_success_total{finished_reason="length",model_name="random:tiny"} 8.0' \
            in metrics
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
        assert not lingering(spawned, grace=30), "a child outlived the server"
        assert "with 2 API server processes" in process.stdout.read()
    finally:
        if process.poll() is None:
            process.kill()


def lingering(pids: list[int], grace: float = 5.0) -> list[str]:
    """The command lines of ``pids`` still running after ``grace`` seconds. multiprocessing's
    resource tracker notices its parent's exit a moment after it, later on a loaded machine."""
    deadline = time.monotonic() + grace
    while (alive := [pid for pid in pids if running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [f"{pid}: {cli.Path(f'/proc/{pid}/cmdline').read_bytes()!r}" for pid in alive]


def running(pid: int) -> bool:
    try:
        state = cli.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_without_its_packages_serve_says_what_to_install(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "uvicorn" else real(name, *a))
    assert cli.main(["serve", "random:tiny"]) == 1
    assert "pip install uvicorn" in capsys.readouterr().err


def test_the_options_carry_vllm_names():
    args = cli.build_parser().parse_args(
        ["serve", "m", "--no-enable-prefix-caching", "--max-num-seqs", "4", "--kv-cache-dtype", "fp8"])
    assert (args.enable_prefix_caching, args.max_num_seqs, args.kv_cache_dtype) == (False, 4, "fp8")
    assert (args.host, args.port) == ("127.0.0.1", 8000)
