"""The live block-pool view (chapter 17's /dashboard) in headless Chromium while a server works.

    python tools/dashboard_snapshot.py [--screenshot _static/ch17_dashboard.png] [--dom FILE]

Starts ``minipaged serve random:tiny`` on 127.0.0.1 with prefix caching, streams requests that
share a prompt prefix (so the pool shows blocks in use, shared and cached), and, mid-load, lets
Chromium render the page: ``--dom`` writes the page as rendered by its script, ``--screenshot`` a
picture of it. Bounded: a fixed number of requests, and every step has a time limit. The test
(tests/test_dashboard_browser.py) checks the rendered page; the chapter shows the screenshot.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import shutil
import subprocess
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.serve_vs_inprocess import free_port, running_server, server_command  # noqa: E402

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                  "--window-size=1000,760", "--virtual-time-budget=2500"]


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def render(url: str, screenshot: Path | None, dom: Path | None, timeout: float = 60) -> None:
    """Chromium's rendering of ``url``: its DOM after the scripts ran, and/or a screenshot."""
    browser = chromium()
    if browser is None:
        raise RuntimeError("no chromium on this machine (Debian: apt-get install chromium)")
    if dom is not None:
        text = subprocess.run([browser, *CHROMIUM_FLAGS, "--dump-dom", url], capture_output=True,
                              text=True, timeout=timeout, check=True).stdout
        dom.write_text(text)
    if screenshot is not None:
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([browser, *CHROMIUM_FLAGS, f"--screenshot={screenshot.resolve()}", url],
                       capture_output=True, timeout=timeout, check=True)


async def load(base_url: str, concurrency: int, started: threading.Event,
               done: threading.Event, most: int = 400, seed: int = 0) -> None:
    """Streamed requests that share a 24-token prefix, ``concurrency`` at a time, until ``done``
    is set (at most ``most`` requests); ``started`` is set when the first one finishes."""
    import httpx

    rng = random.Random(seed)
    prefix = [rng.randrange(1, 512) for _ in range(24)]
    sent = itertools.count()

    async def worker(client):
        while not done.is_set() and next(sent) < most:
            body = {"model": "random:tiny", "max_tokens": 160, "temperature": 0, "stream": True,
                    "ignore_eos": True,
                    "prompt": prefix + [rng.randrange(1, 512) for _ in range(rng.randrange(2, 30))]}
            async with client.stream("POST", "/v1/completions", json=body) as response:
                async for _ in response.aiter_lines():
                    pass
            started.set()  # one request finished: the page has latencies to show

    async with httpx.AsyncClient(base_url=base_url, timeout=300) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))


def snapshot(screenshot: Path | None, dom: Path | None, concurrency: int = 8) -> None:
    """Render /dashboard while a load keeps ``concurrency`` requests in flight: the load goes
    on until the page is rendered, however long Chromium takes to start."""
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    command = server_command("random:tiny", port, {"block_size": 4, "max_num_seqs": 8,
                                                   "num_gpu_blocks_override": 256})
    log = Path(screenshot or dom).with_suffix(".server.log")
    with running_server(command, base_url, log, ready_timeout=120):
        started, done = threading.Event(), threading.Event()
        loader = threading.Thread(target=lambda: asyncio.run(
            load(base_url, concurrency, started, done)), daemon=True)
        loader.start()
        try:
            if not started.wait(300):
                raise RuntimeError("no request finished within 300 s")
            render(base_url + "/dashboard", screenshot, dom)
        finally:
            done.set()
            loader.join(600)
    log.unlink(missing_ok=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--screenshot", type=Path)
    parser.add_argument("--dom", type=Path)
    args = parser.parse_args(argv)
    if args.screenshot is None and args.dom is None:
        args.screenshot = Path("_static/ch17_dashboard.png")
    snapshot(args.screenshot, args.dom)
    print("wrote", *(p for p in (args.screenshot, args.dom) if p))
    return 0


if __name__ == "__main__":
    sys.exit(main())
