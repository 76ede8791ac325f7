# GENERATED from chapters/16_serving.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/16_serving.md § The engine core in a process of its own
"""The engine core: a process of its own that owns the engine and steps it in a busy loop.

The server's processes (its front ends: one, or several that share the port) send it
commands (add a request, abort requests, call a function between two steps, stop) and
receive, once per step, one message with their requests' new tokens and the engine's
stats. Nothing crosses but small pickled tuples: see ``pack`` and ``unpack``.
"""

from __future__ import annotations

import os
import pickle
import queue
import signal
import threading
from multiprocessing.connection import wait as wait_for_any
from typing import Callable

from minipaged.entrypoints.engine_bridge import (EngineBridge, RequestProgress, SampleDelta,
                                                 engine_stats)

__all__ = ["EngineCore", "run_engine_core", "pack", "unpack", "IDLE_WAIT_S"]

IDLE_WAIT_S = 0.5
"""how long an idle core waits for a command before it checks that its server still lives"""


def pack(update: RequestProgress) -> tuple:
    """One request's progress as plain tuples and lists: quick to pickle, small to send."""
    return (update.request_id, update.finished, update.num_cached_tokens, update.metrics,
            update.num_prompt_tokens, update.num_output_tokens, update.longest_sample,
            [(d.index, d.text, d.token_ids, d.finish_reason, d.logprobs)
             for d in update.deltas])


def unpack(packed: tuple) -> RequestProgress:
    """``pack``'s inverse, in the server's process."""
    rid, finished, cached, metrics, prompt, output, longest, deltas = packed
    return RequestProgress(rid, [SampleDelta(*d) for d in deltas], finished, cached, metrics,
                           prompt, output, longest)


def _portable(error: Exception) -> Exception:
    """``error`` if it survives pickling, else a ``ValueError`` with its message."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return ValueError(f"{type(error).__name__}: {error}")


# %% chapters/16_serving.md § The engine core in a process of its own
class EngineCore:
    """The one owner of an engine, in the core process: applies the commands its front ends
    send between two steps, and sends each front end its requests' outputs after every step.
    ``channels``: an ``(inputs, outputs)`` pair of pipe ends per front end. ``metrics``: a
    function that makes the server's metrics, kept here (an object with ``observe(stats,
    progress)``), where every front end's requests pass."""

    def __init__(self, engine, channels: list, parent_pid: int | None = None,
                 metrics: Callable | None = None) -> None:
        self.engine = getattr(engine, "llm_engine", engine)
        self.bridge = EngineBridge(self.engine, self.engine.tokenizer)
        self.inputs = [inputs for inputs, _ in channels]
        self.outputs = [outputs for _, outputs in channels]
        self.parent_pid, self.running = parent_pid, True
        self.front_end: dict[str, int] = {}  # request id -> the front end that added it
        self.metrics = metrics() if metrics is not None else None
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()

    def run(self) -> None:
        sender = threading.Thread(target=self._send_all, name="minipaged-core-sender",
                                  daemon=True)
        sender.start()
        for front in range(len(self.outputs)):
            self.send(("ready", {"max_model_len": self.engine.max_model_len,
                                 "tokenizer": self.bridge.tokenizer}), front)
        while self.running:
            for front, message in self._receive(wait=not self.bridge.has_unfinished()):
                self._apply(front, message)
            if self.running and self.bridge.has_unfinished():
                self._step()
        self._shut_down()
        self._outbox.put(None)
        sender.join()

    def send(self, message: tuple, front: int = 0) -> None:
        self._outbox.put((front, pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)))

    def _send_all(self) -> None:
        while (item := self._outbox.get()) is not None:
            try:
                self.outputs[item[0]].send_bytes(item[1])
            except OSError:  # the server is gone: stop stepping for nobody
                self.running = False
                return

    # %% chapters/16_serving.md § The engine core in a process of its own
    def _receive(self, wait: bool) -> list:
        """Every command waiting on the pipes, as ``(front end, command)``; when ``wait``,
        block until one arrives (checking every ``IDLE_WAIT_S`` that the server still lives)."""
        messages = []
        try:
            while wait and not wait_for_any(self.inputs, IDLE_WAIT_S):
                if self.parent_pid is not None and os.getppid() != self.parent_pid:
                    self.running = False
                    return []
            for front, inputs in enumerate(self.inputs):
                while inputs.poll():
                    messages.append((front, pickle.loads(inputs.recv_bytes())))
        except (EOFError, OSError):  # a front end closed its end or died: the server is going
            self.running = False
        return messages

    def _apply(self, front: int, message: tuple) -> None:
        kind = message[0]
        if kind == "add":
            _, request_id, prompt_ids, params = message
            try:
                self.bridge.add(request_id, prompt_ids, params)
                self.front_end[request_id] = front
                self.send(("added", request_id, None), front)
            except Exception as error:  # refused: nothing was queued, the others go on
                self.send(("added", request_id, _portable(error)), front)
        elif kind == "abort":
            for request_id in message[1]:
                self.bridge.abort(request_id)
                self.front_end.pop(request_id, None)
        elif kind == "call":
            _, call_id, fn = message
            try:
                self.send(("result", call_id, fn(self), None), front)
            except Exception as error:
                self.send(("result", call_id, None, _portable(error)), front)
        elif kind == "stop":
            self.running = False

    # %% chapters/16_serving.md § The engine core in a process of its own
    def _step(self) -> None:
        try:
            progress = self.bridge.step()
        except Exception as error:  # the step left the engine as it was: abort its requests
            reason = f"{type(error).__name__}: {error}"
            for front, failed in enumerate(self._abort_all()):
                self.send(("failed", failed, reason), front)
            return
        stats = engine_stats(self.engine)
        if self.metrics is not None:
            self.metrics.observe(stats, progress)
        packed = [[] for _ in self.outputs]  # every front end hears of every step: the stats
        for update in progress:
            front = self.front_end.get(update.request_id, 0)
            if update.finished:
                self.front_end.pop(update.request_id, None)
            packed[front].append(pack(update))
        for front, updates in enumerate(packed):
            self.send(("step", updates, stats), front)

    def _abort_all(self) -> list[list[str]]:
        """Abort every request in flight (their blocks freed); their ids, per front end."""
        ids = [[] for _ in self.outputs]
        for request_id in list(self.bridge.requests):
            self.bridge.abort(request_id)
            ids[self.front_end.pop(request_id, 0)].append(request_id)
        return ids

    def _shut_down(self) -> None:
        """Abort what is in flight and tell each front end which of its requests ended so."""
        for front, aborted in enumerate(self._abort_all()):
            self.send(("closed", aborted), front)


# %% chapters/16_serving.md § The engine core in a process of its own
def run_engine_core(build: Callable, channels: list, parent_pid: int, inherited: tuple = (),
                    metrics: Callable | None = None) -> None:
    """The core process's entry point: build the engine, then step it until told to stop.
    ``channels``: one ``(inputs, outputs)`` pair per front end. ``inherited``: the server's
    ends of the pipes, which a forked child must close (else it would never see the server
    hang up)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group:
    for end in inherited:                          # the server decides when the core stops
        end.close()
    try:
        engine = build()
    except BaseException as error:
        for _, outputs in channels:
            outputs.send_bytes(pickle.dumps(("dead", f"{type(error).__name__}: {error}")))
        raise
    EngineCore(engine, channels, parent_pid, metrics).run()
