# GENERATED from chapters/16_serving.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/16_serving.md § The engine loop
"""One thread that owns the engine; asyncio handlers talk to it through queues.

Handlers ``submit`` requests, ``abort`` them and ``call`` functions that must see the
engine between steps. The loop thread takes every command waiting in its inbox, applies
it, runs one step, and posts each request's progress to that request's asyncio queue.
Nothing else calls the engine.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from minipaged.entrypoints.engine_bridge import (EngineBridge, EngineStats, RequestProgress,
                                                 engine_stats)

__all__ = ["EngineLoop", "RequestStream", "EngineLoopClosedError", "EngineStepError"]


class EngineLoopClosedError(RuntimeError):
    """The engine loop is shutting down or stopped: the request was not served."""


class EngineStepError(RuntimeError):
    """An engine step failed; the requests that were in it were aborted."""


@dataclass
class _Add:
    request_id: str
    prompt_ids: list[int]
    params: Any
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    accepted: asyncio.Future


@dataclass
class _Call:
    fn: Callable
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


def _settle(future: asyncio.Future, result=None, error: BaseException | None = None) -> None:
    if not future.done():  # the handler may have given up waiting
        future.set_exception(error) if error is not None else future.set_result(result)


# %% chapters/16_serving.md § The engine loop
class RequestStream:
    """One request's ``RequestProgress`` updates, as an async iterator that ends after the
    finished one. ``abort()`` (also on leaving ``async with``) cancels an unfinished request."""

    def __init__(self, owner: EngineLoop, request_id: str, events: asyncio.Queue) -> None:
        self.owner, self.request_id, self.events = owner, request_id, events
        self.finished = False

    def __aiter__(self):
        return self

    async def __anext__(self) -> RequestProgress:
        if self.finished:
            raise StopAsyncIteration
        item = await self.events.get()
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        self.finished = item.finished
        return item

    def abort(self) -> None:
        if not self.finished:
            self.finished = True
            self.owner.abort(self.request_id)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        self.abort()


# %% chapters/16_serving.md § The engine loop
class EngineLoop:
    """The one owner of an engine (``LLM`` or ``LLMEngine``): a thread that applies the
    inbox's commands and steps. ``max_waiting``: ``queue_full()`` once that many requests
    wait (the server answers 503). ``observers``: callables ``(stats, progress)`` run on
    the loop's thread after every step (metrics)."""

    def __init__(self, llm, tokenizer=None, *, max_waiting: int | None = None) -> None:
        self.engine = getattr(llm, "llm_engine", llm)
        self.tokenizer = tokenizer or self.engine.tokenizer
        self.max_model_len = self.engine.max_model_len
        self.bridge = EngineBridge(self.engine, self.tokenizer)
        self.max_waiting = max_waiting
        self.observers: list[Callable] = []
        self.stats = EngineStats()  # published by the loop after each step
        self.last_error: str | None = None
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> EngineLoop:
        self._thread = threading.Thread(target=self._run, name="minipaged-engine-loop",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 60.0) -> None:
        """Stop taking requests, abort those in flight (their blocks freed), end the thread."""
        self._closing.set()
        self._inbox.put(None)
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return (self._thread is not None and self._thread.is_alive()
                and not self._closing.is_set())

    @property
    def num_running(self) -> int:
        return self.stats.num_running

    @property
    def num_waiting(self) -> int:
        return self.stats.num_waiting

    def queue_full(self) -> bool:
        """Whether ``max_waiting`` requests already wait (queued in the engine or the inbox)."""
        return (self.max_waiting is not None
                and self.num_waiting + self._inbox.qsize() >= self.max_waiting)

    # %% chapters/16_serving.md § The engine loop
    async def submit(self, prompt_ids: list[int], params, *,
                     request_id: str | None = None) -> RequestStream:
        """Queue a request; returns its stream once the engine accepted it, or raises what
        the engine raised (nothing queued)."""
        if not self.alive:
            raise EngineLoopClosedError("the server is shutting down")
        loop, request_id = asyncio.get_running_loop(), request_id or uuid.uuid4().hex
        events, accepted = asyncio.Queue(), loop.create_future()
        self._inbox.put(_Add(request_id, list(prompt_ids), params, loop, events, accepted))
        try:
            await accepted
        except asyncio.CancelledError:  # the client left before the answer: undo
            self.abort(request_id)
            raise
        return RequestStream(self, request_id, events)

    def abort(self, request_id: str) -> None:
        """Cancel a request at the next step boundary (a no-op once it finished)."""
        self._inbox.put(("abort", request_id))

    async def call(self, fn: Callable[[EngineLoop], Any]) -> Any:
        """``fn(self)`` run on the loop's thread between two steps; its result."""
        if not self.alive:
            raise EngineLoopClosedError("the server is shutting down")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._inbox.put(_Call(fn, loop, future))
        return await future

    # %% chapters/16_serving.md § The engine loop
    def _run(self) -> None:
        while not self._closing.is_set():
            try:
                idle = not self.bridge.has_unfinished()
                for command in self._drain(block=idle):
                    self._apply(command)
                self._publish()
                if not self._closing.is_set() and self.bridge.has_unfinished():
                    self._step()
            except Exception as error:  # a bug of ours, not the engine's: fail loudly, not silently
                self.last_error = f"{type(error).__name__}: {error}"
                self._closing.set()
        self._shut_down()

    def _drain(self, block: bool) -> list:
        commands = [self._inbox.get()] if block else []
        try:
            while True:
                commands.append(self._inbox.get_nowait())
        except queue.Empty:
            return commands

    def _apply(self, command) -> None:
        if isinstance(command, _Add):
            try:
                self.bridge.add(command.request_id, command.prompt_ids, command.params)
            except Exception as error:  # refused: nothing was queued, the others go on
                command.loop.call_soon_threadsafe(_settle, command.accepted, None, error)
                return
            self._streams[command.request_id] = (command.loop, command.events)
            command.loop.call_soon_threadsafe(_settle, command.accepted, None)
        elif isinstance(command, _Call):
            try:
                result, error = command.fn(self), None
            except Exception as failure:
                result, error = None, failure
            command.loop.call_soon_threadsafe(_settle, command.future, result, error)
        elif isinstance(command, tuple) and command[0] == "abort":
            if self.bridge.abort(command[1]):
                self._streams.pop(command[1], None)

    # %% chapters/16_serving.md § The engine loop
    def _post(self, request_id: str, item) -> None:
        target = self._streams.get(request_id)
        if target is None:
            return
        loop, events = target
        try:
            loop.call_soon_threadsafe(events.put_nowait, item)
        except RuntimeError:  # that event loop is closed: nobody is listening any more
            self._streams.pop(request_id, None)

    def _step(self) -> None:
        try:
            progress = self.bridge.step()
        except Exception as error:  # the step left the engine as it was: abort its requests
            self.last_error = f"{type(error).__name__}: {error}"
            for request_id in list(self.bridge.requests):
                self._fail(request_id, EngineStepError(self.last_error))
            return
        for update in progress:
            self._post(update.request_id, update)
            if update.finished:
                self._streams.pop(update.request_id, None)
        self._publish()
        for observe in self.observers:
            observe(self.stats, progress)

    def _fail(self, request_id: str, error: BaseException) -> None:
        try:
            self.bridge.abort(request_id)
        finally:
            self._post(request_id, error)
            self._streams.pop(request_id, None)

    def _publish(self) -> None:
        self.stats = engine_stats(self.engine)

    def _shut_down(self) -> None:
        """Abort what is in flight and refuse what is still in the inbox."""
        closed = EngineLoopClosedError("the server is shutting down")
        for request_id in list(self.bridge.requests):
            self._fail(request_id, closed)
        for command in self._drain(block=False):
            if isinstance(command, _Add):
                command.loop.call_soon_threadsafe(_settle, command.accepted, None, closed)
            elif isinstance(command, _Call):
                command.loop.call_soon_threadsafe(_settle, command.future, None, closed)
        self._publish()
