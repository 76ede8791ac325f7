"""A disconnect soak of ``minipaged serve`` on 127.0.0.1: many streamed requests, a random third of
them cut off by their client at a random chunk; afterwards every block must be back, the manager
consistent, the server still serving, and its memory flat.

    python benchmarks/serve_soak.py [--requests 1000] [--concurrency 32] [--out results]
        [--model random:tiny] [--deadline 900]

The server runs as a subprocess (``python -m minipaged serve``); its resident memory (``VmRSS`` from
``/proc``) is read after each quarter of the requests. Writes OUT/serve_soak_<device>.json and exits 1
if any check fails. Bounded: the requests are counted and the whole run has a deadline.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import platform
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.serve_vs_inprocess import free_port, running_server, server_command  # noqa: E402


def rss_mib(pid: int) -> float:
    """The resident memory of process ``pid`` in MiB (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, ValueError):  # it ended meanwhile
            continue
    return found


def memory_sample(after: int, pid: int) -> dict:
    """The server's resident memory: the front end's, and with its children's (the engine
    core runs in a child process)."""
    front_end = total = rss_mib(pid)
    for child in children(pid):
        try:
            total += rss_mib(child)
        except (OSError, RuntimeError):  # it ended meanwhile
            continue
    return {"after_requests": after, "rss_mib": total, "front_end_rss_mib": front_end}


def pool_problems(state: dict) -> list[str]:
    """What is wrong with a ``/dashboard/state`` snapshot taken when nothing runs (empty: nothing)."""
    problems = []
    if state["num_free_blocks"] != state["num_blocks"]:
        problems.append(f"{state['num_blocks'] - state['num_free_blocks']} blocks not returned")
    if state["holders"]:
        problems.append(f"blocks still held by {sorted(state['holders'])[:5]}")
    if state["running"] or state["waiting"]:
        problems.append("requests still running or waiting")
    if not state["consistent"]:
        problems.append("the manager is inconsistent")
    return problems


async def soak(base_url: str, model: str, requests: int, concurrency: int, seed: int, pid: int,
               deadline: float, vocab: int) -> dict:
    import httpx

    rng = random.Random(seed)
    cut = set(rng.sample(range(requests), requests // 3))
    cut_at = {i: rng.randrange(1, 6) for i in cut}  # the chunk after which the client leaves
    outcome = {"completed": 0, "cut": 0, "failed": 0}
    memory = [memory_sample(0, pid)]
    gate = asyncio.Semaphore(concurrency)
    finished = 0

    async def one(client, i):
        nonlocal finished
        body = {"model": model, "prompt": [rng.randrange(1, vocab) for _ in range(rng.randrange(3, 40))],
                "max_tokens": rng.randrange(4, 24), "temperature": 0, "stream": True,
                "ignore_eos": True}
        async with gate:
            try:
                async with client.stream("POST", "/v1/completions", json=body) as response:
                    if response.status_code != 200:
                        outcome["failed"] += 1
                        return
                    chunks = 0
                    async for line in response.aiter_lines():
                        if line.startswith("data: {"):
                            chunks += 1
                            if i in cut and chunks >= cut_at[i]:
                                outcome["cut"] += 1
                                return  # leaving the block closes the connection mid-stream
                        elif line == "data: [DONE]":
                            outcome["completed" if i not in cut else "cut"] += 1
                            return
                outcome["failed"] += 1
            except httpx.HTTPError:
                outcome["failed"] += 1
            finally:
                finished += 1
                if finished % (requests // 4) == 0:
                    memory.append(memory_sample(finished, pid))

    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        start = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(one(client, i) for i in range(requests))),
                               max(1.0, deadline - time.monotonic()))
        seconds = time.perf_counter() - start
        state = None
        settle_until = time.monotonic() + 60
        while time.monotonic() < settle_until:  # the last aborts apply at a step boundary
            state = (await client.get("/dashboard/state")).json()
            if not pool_problems(state):
                break
            await asyncio.sleep(0.2)
        after = await client.post("/v1/completions", json={"model": model, "prompt": [1, 2, 3],
                                                          "max_tokens": 2, "temperature": 0})
    return {"requests": requests, "concurrency": concurrency, "cut_planned": len(cut),
            "seconds": seconds, **outcome, "memory": memory,
            "pool_problems": pool_problems(state), "num_blocks": state["num_blocks"],
            "serves_afterwards": after.status_code == 200
            and after.json()["usage"]["completion_tokens"] == 2}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--model", default="random:tiny")
    parser.add_argument("--vocab", type=int, default=512, help="token ids drawn below this")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deadline", type=float, default=900, help="seconds for the whole run")
    parser.add_argument("--out", default="results")
    args = parser.parse_args(argv)
    import torch

    deadline = time.monotonic() + args.deadline
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    command = server_command(args.model, port, {"max_num_seqs": 16, "block_size": 4})
    with running_server(command, base_url, out / "serve_soak_server.log") as process:
        result = asyncio.run(soak(base_url, args.model, args.requests, args.concurrency,
                                  args.seed, process.pid, deadline, args.vocab))
    on_gpu = torch.cuda.is_available()
    record = {"device": torch.cuda.get_device_name() if on_gpu else f"cpu ({platform.node()})",
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "command": "python benchmarks/serve_soak.py " + " ".join(
                  sys.argv[1:] if argv is None else argv),
              "server": " ".join(command[1:]), **result}
    rss = [m["rss_mib"] for m in result["memory"][1:]]
    record["rss_growth_mib_second_half"] = rss[-1] - rss[len(rss) // 2 - 1] if len(rss) > 1 else None
    path = out / f"serve_soak_{'h200' if on_gpu else 'cpu'}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    ok = (not result["pool_problems"] and result["serves_afterwards"] and result["failed"] == 0
          and result["completed"] + result["cut"] == args.requests)
    print(f"{result['completed']} completed, {result['cut']} cut, {result['failed']} failed in "
          f"{result['seconds']:.0f} s; pool: {result['pool_problems'] or 'every block back'}; "
          f"RSS {[round(m['rss_mib']) for m in result['memory']]} MiB; wrote {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
