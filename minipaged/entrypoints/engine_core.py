# GENERATED from chapters/15_serving.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/15_serving.md § The engine core in a process of its own
"""The engine core: a process of its own that owns the engine and steps it in a busy loop.

The server's process sends it commands (add a request, abort requests, call a function
between two steps, stop) and receives, once per step, one message with every request's
new tokens and the engine's stats. Nothing crosses but small pickled tuples: see
``pack`` and ``unpack``.
"""

from __future__ import annotations

import os
import pickle
import queue
import signal
import threading
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


# %% chapters/15_serving.md § The engine core in a process of its own
class EngineCore:
    """The one owner of an engine, in the core process: applies the commands that arrive on
    ``inputs`` between two steps and sends every step's outputs on ``outputs``."""

    def __init__(self, engine, inputs, outputs, parent_pid: int | None = None) -> None:
        self.engine = getattr(engine, "llm_engine", engine)
        self.bridge = EngineBridge(self.engine, self.engine.tokenizer)
        self.inputs, self.outputs, self.parent_pid = inputs, outputs, parent_pid
        self.running = True
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()

    def run(self) -> None:
        sender = threading.Thread(target=self._send_all, name="minipaged-core-sender",
                                  daemon=True)
        sender.start()
        self.send(("ready", {"max_model_len": self.engine.max_model_len,
                             "tokenizer": self.bridge.tokenizer}))
        while self.running:
            for message in self._receive(wait=not self.bridge.has_unfinished()):
                self._apply(message)
            if self.running and self.bridge.has_unfinished():
                self._step()
        self._shut_down()
        self._outbox.put(None)
        sender.join()

    def send(self, message: tuple) -> None:
        self._outbox.put(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))

    def _send_all(self) -> None:
        while (data := self._outbox.get()) is not None:
            try:
                self.outputs.send_bytes(data)
            except OSError:  # the server is gone: stop stepping for nobody
                self.running = False
                return

    # %% chapters/15_serving.md § The engine core in a process of its own
    def _receive(self, wait: bool) -> list:
        """Every command waiting on the pipe; when ``wait``, block until one arrives (checking
        every ``IDLE_WAIT_S`` that the server process still lives)."""
        messages = []
        try:
            while wait and not self.inputs.poll(IDLE_WAIT_S):
                if self.parent_pid is not None and os.getppid() != self.parent_pid:
                    self.running = False
                    return []
            while self.inputs.poll():
                messages.append(pickle.loads(self.inputs.recv_bytes()))
        except (EOFError, OSError):  # the server closed its end or died
            self.running = False
        return messages

    def _apply(self, message: tuple) -> None:
        kind = message[0]
        if kind == "add":
            _, request_id, prompt_ids, params = message
            try:
                self.bridge.add(request_id, prompt_ids, params)
                self.send(("added", request_id, None))
            except Exception as error:  # refused: nothing was queued, the others go on
                self.send(("added", request_id, _portable(error)))
        elif kind == "abort":
            for request_id in message[1]:
                self.bridge.abort(request_id)
        elif kind == "call":
            _, call_id, fn = message
            try:
                self.send(("result", call_id, fn(self), None))
            except Exception as error:
                self.send(("result", call_id, None, _portable(error)))
        elif kind == "stop":
            self.running = False

    # %% chapters/15_serving.md § The engine core in a process of its own
    def _step(self) -> None:
        try:
            progress = self.bridge.step()
        except Exception as error:  # the step left the engine as it was: abort its requests
            failed = list(self.bridge.requests)
            for request_id in failed:
                self.bridge.abort(request_id)
            self.send(("failed", failed, f"{type(error).__name__}: {error}"))
            return
        self.send(("step", [pack(u) for u in progress], engine_stats(self.engine)))

    def _shut_down(self) -> None:
        """Abort what is in flight (its blocks freed) and say which requests ended so."""
        aborted = list(self.bridge.requests)
        for request_id in aborted:
            self.bridge.abort(request_id)
        self.send(("closed", aborted))


# %% chapters/15_serving.md § The engine core in a process of its own
def run_engine_core(build: Callable, inputs, outputs, parent_pid: int,
                    inherited: tuple = ()) -> None:
    """The core process's entry point: build the engine, then step it until told to stop.
    ``inherited``: the server's ends of the pipes, which a forked child must close (else it
    would never see the server hang up)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group:
    for end in inherited:                          # the server decides when the core stops
        end.close()
    try:
        engine = build()
    except BaseException as error:
        outputs.send_bytes(pickle.dumps(("dead", f"{type(error).__name__}: {error}")))
        raise
    EngineCore(engine, inputs, outputs, parent_pid).run()
