# GENERATED from chapters/16_serving.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/16_serving.md § The engine core in a process of its own
"""The server's side of the engine core process.

``EngineCoreClient`` starts the core, sends it commands and hands each step's outputs to
the requests' streams. It has ``EngineLoop``'s methods (``submit``, ``abort``, ``call``,
``queue_full``, ``stop``), so the app does not care which of the two owns the engine.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import os
import pickle
import queue
import threading
import time
import uuid
import warnings
from dataclasses import replace
from typing import Any, Callable

from minipaged.entrypoints.engine_bridge import EngineStats, RequestProgress, SampleDelta
from minipaged.entrypoints.engine_core import run_engine_core, unpack
from minipaged.entrypoints.engine_loop import EngineLoopClosedError, EngineStepError

__all__ = ["EngineCoreClient", "CoreStream", "EngineCoreError", "merge_progress"]


class EngineCoreError(RuntimeError):
    """The engine core process could not start."""


# %% chapters/16_serving.md § The engine core in a process of its own
def merge_progress(updates: list[RequestProgress]) -> RequestProgress:
    """Several steps' progress of one request as one: each sample's text, tokens and
    log-probabilities joined, the counters of the last step."""
    if len(updates) == 1:
        return updates[0]
    samples: dict[int, SampleDelta] = {}
    for update in updates:
        for d in update.deltas:
            s = samples.get(d.index)
            if s is None:
                samples[d.index] = replace(d, token_ids=list(d.token_ids), logprobs=(
                    None if d.logprobs is None else list(d.logprobs)))
                continue
            s.text, s.token_ids = s.text + d.text, s.token_ids + d.token_ids
            if d.logprobs is not None:
                s.logprobs = (s.logprobs or []) + d.logprobs
            s.finish_reason = d.finish_reason or s.finish_reason
    return replace(updates[-1], deltas=list(samples.values()))


def _push_all(pairs: list) -> None:
    for stream, item in pairs:
        stream.push(item)


def _settle(future: asyncio.Future, result=None, error: BaseException | None = None) -> None:
    if not future.done():  # the handler may have given up waiting
        future.set_exception(error) if error is not None else future.set_result(result)


# %% chapters/16_serving.md § The engine core in a process of its own
class CoreStream:
    """One request's progress as an async iterator that ends after the finished update;
    what arrived since the last ``__anext__`` comes merged (``merge_progress``)."""

    def __init__(self, owner: EngineCoreClient, request_id: str,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.owner, self.request_id, self.loop = owner, request_id, loop
        self.pending: list = []  # RequestProgress, or an exception that ends the stream
        self.ready = asyncio.Event()
        self.finished = False

    def push(self, item) -> None:
        """Called on ``loop`` (the reader hands items over with ``call_soon_threadsafe``)."""
        self.pending.append(item)
        self.ready.set()

    def __aiter__(self):
        return self

    async def __anext__(self) -> RequestProgress:
        if self.finished:
            raise StopAsyncIteration
        while not self.pending:
            self.ready.clear()
            await self.ready.wait()
        cut = next((i for i, x in enumerate(self.pending) if isinstance(x, BaseException)),
                   len(self.pending))
        if cut == 0:
            self.finished = True
            raise self.pending[0]
        items, self.pending = self.pending[:cut], self.pending[cut:]
        update = merge_progress(items)
        self.finished = update.finished
        return update

    def abort(self) -> None:
        if not self.finished:
            self.finished = True
            self.owner.abort(self.request_id)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        self.abort()


# %% chapters/16_serving.md § The engine core in a process of its own
class EngineCoreClient:
    """The engine core process and a front end's side of it. ``engine``: an engine built
    here, which the core inherits (the process is forked); or ``build``: a function the
    core calls to build one (spawned: the way on a GPU, where CUDA rules out forking); or
    ``channel``: a core another front end started (one of its ``spare_channels``).
    ``metrics``: a function that makes the server's metrics in the core. ``max_waiting``:
    ``queue_full()`` once that many requests wait. ``observers``: callables ``(stats,
    progress)`` run here after every step."""

    def __init__(self, engine=None, *, build: Callable | None = None,
                 channel: tuple | None = None, metrics: Callable | None = None,
                 max_waiting: int | None = None, ready_timeout: float = 600.0) -> None:
        if sum(x is not None for x in (engine, build, channel)) != 1:
            raise TypeError("give one of: an engine, a function that builds one, a channel")
        engine = getattr(engine, "llm_engine", engine)
        self.start_method = "fork" if engine is not None else "spawn"
        self._build = build or (lambda: engine)  # a forked child needs no pickling
        self.channel, self.spare_channels = channel, []
        self.metrics, self.tokenizer = metrics, getattr(engine, "tokenizer", None)
        self.max_model_len = getattr(engine, "max_model_len", None)
        self.max_waiting, self.ready_timeout = max_waiting, ready_timeout
        self.observers: list[Callable] = []
        self.stats, self.last_error = EngineStats(), None
        self.process: multiprocessing.Process | None = None  # None: not started, or attached
        self._started = False
        self._streams: dict[str, CoreStream] = {}
        self._futures: dict[tuple, tuple] = {}  # ("add", id) or ("call", n) -> loop, future
        self._calls, self._unacked = itertools.count(), 0
        self._lock = threading.Lock()  # guards _alive against registering a future late
        self._alive = self._closing = False
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()

    @property
    def alive(self) -> bool:
        return self._alive and not self._closing

    @property
    def num_running(self) -> int:
        return self.stats.num_running

    @property
    def num_waiting(self) -> int:
        return self.stats.num_waiting

    def queue_full(self) -> bool:
        """Whether ``max_waiting`` requests already wait (in the engine, or on their way)."""
        return (self.max_waiting is not None
                and self.stats.num_waiting + self._unacked >= self.max_waiting)

    # %% chapters/16_serving.md § The engine core in a process of its own
    def start(self, front_ends: int = 1) -> EngineCoreClient:
        """Start the core (for a client given a ``channel``: connect to it). ``front_ends``: how
        many server processes share the core; the channels of the others wait in
        ``spare_channels``, for ``EngineCoreClient(channel=...)`` in those processes."""
        if self._started:
            return self
        self._started = True
        if self.channel is None:
            context = multiprocessing.get_context(self.start_method)
            pipes = [(context.Pipe(duplex=False), context.Pipe(duplex=False))
                     for _ in range(front_ends)]  # (core_in, to_core), (from_core, core_out)
            theirs = [(core_in, core_out) for (core_in, _), (_, core_out) in pipes]
            ours = [(to_core, from_core) for (_, to_core), (from_core, _) in pipes]
            inherited = [end for pair in ours for end in pair] if self.start_method == "fork" else []
            self.process = context.Process(
                target=run_engine_core, name="minipaged-engine-core", daemon=True,
                args=(self._build, theirs, os.getpid(), inherited, self.metrics))
            with warnings.catch_warnings():  # Python warns that forking a threaded process may
                warnings.simplefilter("ignore", DeprecationWarning)  # deadlock; the child runs
                self.process.start()                                 # only the core's code
            for end in (end for pair in theirs for end in pair):
                end.close()
            self.channel, self.spare_channels = ours[0], ours[1:]
        self._to_core, self._from_core = self.channel
        self._await_ready()
        self._alive = True
        for target, name in ((self._read_all, "reader"), (self._send_all, "sender")):
            threading.Thread(target=target, name=f"minipaged-core-{name}", daemon=True).start()
        return self

    def _await_ready(self) -> None:
        deadline, ours = time.monotonic() + self.ready_timeout, self.process is not None
        while not self._from_core.poll(0.2):
            if (ours and not self.process.is_alive()) or time.monotonic() > deadline:
                if ours:
                    self.process.kill()
                code = self.process.exitcode if ours else None
                raise EngineCoreError(f"the engine core did not start (exit code {code})")
        kind, info = pickle.loads(self._from_core.recv_bytes())
        if kind == "dead":
            if ours:
                self.process.join(10)
            raise EngineCoreError(f"the engine core could not build the engine: {info}")
        self.max_model_len = info["max_model_len"]
        self.tokenizer = self.tokenizer or info["tokenizer"]

    def _send_all(self) -> None:
        while (message := self._outbox.get()) is not None:
            try:
                self._to_core.send_bytes(message)
            except OSError:  # the core is gone; the reader reports it
                return

    # %% chapters/16_serving.md § The engine core in a process of its own
    def _send(self, *message) -> None:
        self._outbox.put(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))

    def _expect(self, key: tuple) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:
            if not self.alive:
                raise EngineLoopClosedError(self.last_error or "the server is shutting down")
            self._futures[key] = (loop, future)
        return future

    async def submit(self, prompt_ids: list[int], params, *,
                     request_id: str | None = None) -> CoreStream:
        """Queue a request; its stream once the engine accepted it, or what the engine raised."""
        request_id = request_id or uuid.uuid4().hex
        accepted = self._expect(("add", request_id))
        stream = self._streams[request_id] = CoreStream(self, request_id,
                                                        asyncio.get_running_loop())
        self._unacked += 1
        self._send("add", request_id, list(prompt_ids), params)
        try:
            await accepted
        except asyncio.CancelledError:  # the client left before the answer: undo
            self.abort(request_id)
            raise
        except BaseException:
            self._streams.pop(request_id, None)
            raise
        return stream

    def abort(self, request_id: str) -> None:
        """Cancel a request at the core's next step boundary (a no-op once it finished)."""
        if self._streams.pop(request_id, None) is not None and self.alive:
            self._send("abort", [request_id])

    async def call(self, fn: Callable) -> Any:
        """``fn(core)`` run in the core between two steps (``fn`` must pickle: a module-level
        function, as ``block_pool_state``); its result."""
        call_id = next(self._calls)
        result = self._expect(("call", call_id))
        self._send("call", call_id, fn)
        return await result

    # %% chapters/16_serving.md § The engine core in a process of its own
    def _read_all(self) -> None:
        while True:
            try:
                message = pickle.loads(self._from_core.recv_bytes())
            except (EOFError, OSError):  # the core closed its end: it stopped, or it died
                break
            try:
                self._handle(*message)
            except Exception as error:  # a bug of ours (an observer's?): say so, keep reading
                self.last_error = f"{type(error).__name__}: {error}"
        self._gone()

    def _handle(self, kind: str, *body) -> None:
        if kind == "step":
            packed, self.stats = body
            progress = [unpack(p) for p in packed]
            for observe in self.observers:
                observe(self.stats, progress)
            self._deliver([(self._streams.get(u.request_id), u) for u in progress])
            for update in progress:
                if update.finished:
                    self._streams.pop(update.request_id, None)
        elif kind in ("added", "result"):
            key, result, error = (("add", body[0]), None, body[1]) if kind == "added" else (
                ("call", body[0]), body[1], body[2])
            self._unacked -= kind == "added"
            loop, future = self._futures.pop(key, (None, None))
            if loop is not None:
                loop.call_soon_threadsafe(_settle, future, result, error)
        elif kind in ("failed", "closed"):
            error = (EngineStepError(body[1]) if kind == "failed"
                     else EngineLoopClosedError("the server is shutting down"))
            self.last_error = body[1] if kind == "failed" else self.last_error
            # "closed": the core stopped on purpose (another front end may have asked)
            self._closing = self._closing or kind == "closed"
            self._deliver([(self._streams.pop(rid, None), error) for rid in body[0]])

    def _deliver(self, items: list) -> None:
        """Hand ``(stream, item)`` pairs to the streams' event loops, one call per loop."""
        by_loop: dict = {}
        for stream, item in items:
            if stream is not None:
                by_loop.setdefault(stream.loop, []).append((stream, item))
        for loop, pairs in by_loop.items():
            try:
                loop.call_soon_threadsafe(_push_all, pairs)
            except RuntimeError:  # that event loop is closed: nobody listens any more
                pass

    # %% chapters/16_serving.md § The engine core in a process of its own
    def _gone(self) -> None:
        if self.process is not None and not self._closing:  # stop() joins a core it stopped
            self.process.join(5)
        with self._lock:
            self._alive, futures = False, list(self._futures.values())
            self._futures.clear()
        if self._closing:
            error = EngineLoopClosedError("the server is shutting down")
        else:
            code = self.process.exitcode if self.process is not None else "unknown here"
            self.last_error = (f"the engine core process died (exit code {code})"
                               + (f" after: {self.last_error}" if self.last_error else ""))
            error = EngineStepError(self.last_error)
        closed = EngineLoopClosedError(self.last_error or "the server is shutting down")
        for loop, future in futures:
            loop.call_soon_threadsafe(_settle, future, None, closed)
        self._deliver([(self._streams.pop(rid, None), error) for rid in list(self._streams)])
        self._outbox.put(None)  # ends the sender thread

    def stop(self, timeout: float = 60.0) -> None:
        """Tell the core to abort what is in flight and exit; wait ``timeout`` seconds for it
        (0: do not wait, as in a signal handler), then end it by force. Any front end may stop
        the core: the server stops as a whole."""
        if not self._started:
            return
        if not self._closing:
            self._closing = True
            self._send("stop")
        if timeout == 0 or self.process is None:
            return
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(10)
