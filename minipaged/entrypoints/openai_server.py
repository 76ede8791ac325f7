# GENERATED from chapters/17_openai_server.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/17_openai_server.md § The OpenAI protocol
"""An OpenAI-compatible HTTP server in front of an ``EngineLoop`` (FastAPI).

``create_app(llm, ...)`` builds the app: ``/v1/models``, ``/v1/completions``,
``/v1/chat/completions`` (``stream: true`` as server-sent events), ``/health``,
``/metrics`` (Prometheus) and ``/dashboard`` (a live view of the block pool). The
handlers never call the engine: they talk to the engine loop, its one owner.
"""

from __future__ import annotations

import hmac
import json
import time
import uuid
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

import torch

from minipaged.entrypoints.dashboard import DASHBOARD_HTML, block_pool_state
from minipaged.engine.llm_engine import InvalidRequestError
from minipaged.entrypoints.core_client import EngineCoreClient
from minipaged.entrypoints.engine_bridge import SampleDelta
from minipaged.entrypoints.engine_loop import EngineLoop, EngineLoopClosedError, EngineStepError
from minipaged.entrypoints.metrics import ServerMetrics, render_metrics
from minipaged.entrypoints.openai_protocol import (ChatCompletionRequest, CompletionRequest,
                                                   OpenAIError, error_body)
from minipaged.engine.scheduler import PromptTooLongError, SamplingParams

__all__ = ["create_app", "prompt_token_ids", "sampling_params"]


# %% chapters/17_openai_server.md § The OpenAI protocol
def prompt_token_ids(body, tokenizer) -> list[int]:
    """The prompt of a completions or chat body as token ids."""
    if isinstance(body, ChatCompletionRequest):
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise OpenAIError(400, "this model has no chat template: use /v1/completions",
                              param="messages")
        try:
            text = tokenizer.apply_chat_template([m.model_dump() for m in body.messages],
                                                 add_generation_prompt=True, tokenize=False)
        except Exception as error:  # the template rejects the conversation
            raise OpenAIError(400, f"the chat template failed: {error}", param="messages")
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    elif isinstance(body.prompt, str):
        if tokenizer is None:
            raise OpenAIError(400, "this model has no tokenizer: send the prompt as token ids",
                              param="prompt")
        ids = tokenizer(body.prompt)["input_ids"]
    else:
        ids = body.prompt
    if not ids:
        raise OpenAIError(400, "the prompt is empty", param="prompt")
    return list(ids)


# %% chapters/17_openai_server.md § The OpenAI protocol
def sampling_params(body, num_prompt_tokens: int, max_model_len: int) -> SamplingParams:
    """The body's sampling fields as ``SamplingParams``; ``OpenAIError`` (400) if invalid."""
    if isinstance(body, ChatCompletionRequest):
        if body.top_logprobs is not None and not body.logprobs:
            raise OpenAIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
    else:
        logprobs = body.logprobs
    room = max_model_len - num_prompt_tokens
    if room < 1:
        raise OpenAIError(400, f"the prompt has {num_prompt_tokens} tokens; this model's "
                          f"context is {max_model_len} tokens", param="prompt")
    chat_limit = getattr(body, "max_completion_tokens", None)
    max_tokens = body.max_tokens if body.max_tokens is not None else chat_limit
    if max_tokens is None:
        max_tokens = room if isinstance(body, ChatCompletionRequest) else min(16, room)
    if max_tokens > room:
        raise OpenAIError(400, f"max_tokens = {max_tokens} plus the prompt's "
                          f"{num_prompt_tokens} tokens exceed this model's context of "
                          f"{max_model_len} tokens", param="max_tokens")
    try:
        return SamplingParams(
            n=body.n, temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            top_k=0 if body.top_k is None else body.top_k, max_tokens=max_tokens,
            seed=body.seed, ignore_eos=body.ignore_eos,
            stop=(body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ()),
            include_stop_str_in_output=body.include_stop_str_in_output, logprobs=logprobs)
    except ValueError as error:
        raise OpenAIError(400, str(error), param=str(error).split(" ", 1)[0])


# %% chapters/17_openai_server.md § Streaming
@dataclass
class _Answer:
    """What every chunk of one answer repeats."""

    kind: str  # "completion" or "chat"
    id: str
    model: str
    created: int
    n: int
    prompt_tokens: int
    tokenizer: Any = None
    top_logprobs: int | None = None  # k of ``logprobs``; None: none asked for
    offsets: dict = field(default_factory=dict)  # sample -> text offset of its next token

    def chunk(self, choices: list, usage=None, with_usage: bool = False) -> str:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        body = {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "choices": choices}
        if with_usage:
            body["usage"] = usage
        return f"data: {json.dumps(body)}\n\n"

    def choice(self, index: int, text: str, reason, opening: bool = False,
               logprobs=None) -> dict:
        if self.kind == "chat":
            delta = {"role": "assistant", "content": text} if opening else (
                {"content": text} if text else {})
            return {"index": index, "delta": delta, "logprobs": logprobs,
                    "finish_reason": reason}
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}

    # %% chapters/17_openai_server.md § Streaming
    def logprobs(self, d: SampleDelta) -> dict | None:
        """The log-probabilities of ``d``'s tokens in OpenAI's shape (chat or completions)."""
        if self.top_logprobs is None or d.logprobs is None:
            return None
        if self.kind == "chat":
            return {"content": [{**self._token(t, lp[t]), "top_logprobs": [
                self._token(u, v) for u, v in self._top(lp)]}
                for t, lp in zip(d.token_ids, d.logprobs)]}
        tokens, offsets, at = [self._text(t) for t in d.token_ids], [], self.offsets.get(d.index, 0)
        for token in tokens:
            offsets.append(at)
            at += len(token)
        self.offsets[d.index] = at
        return {"tokens": tokens,
                "token_logprobs": [lp[t] for t, lp in zip(d.token_ids, d.logprobs)],
                "top_logprobs": [{self._text(u): v for u, v in self._top(lp)}
                                 for lp in d.logprobs], "text_offset": offsets}

    def _text(self, token_id: int) -> str:
        if self.tokenizer is None:
            return f"token_id:{token_id}"
        return self.tokenizer.decode([token_id])

    def _token(self, token_id: int, logprob: float) -> dict:
        text = self._text(token_id)
        return {"token": text, "logprob": logprob, "bytes": self._bytes(token_id, text)}

    def _bytes(self, token_id: int, text: str) -> list[int]:
        """The token's own UTF-8 bytes: part of a character for a token that decodes to
        U+FFFD alone (a byte-level BPE piece, or SentencePiece's ``<0xE2>``)."""
        if "\ufffd" not in text or self.tokenizer is None:
            return list(text.encode())
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return [int(piece[3:5], 16)]
        if all(ch in _BYTE_OF for ch in piece):
            return [_BYTE_OF[ch] for ch in piece]
        return list(text.encode())

    def _top(self, entry: dict) -> list:
        return sorted(entry.items(), key=lambda kv: -kv[1])[:self.top_logprobs]

    def usage(self, completion_tokens: int, cached: int) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": self.prompt_tokens + completion_tokens,
                "prompt_tokens_details": {"cached_tokens": cached}}


# %% chapters/17_openai_server.md § Streaming
def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet: the character that stands for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return {chr(b if b in printable else next(extra)): b for b in range(256)}


_BYTE_OF = _byte_level_alphabet()


# %% chapters/17_openai_server.md § Streaming
DISCONNECT_CHECK_S = 0.1
"""how often a stream asks whether its client left (Starlette also cancels a stream whose
client is gone; asking at every step would cost more than writing the chunks)"""


async def _events(answer: _Answer, stream, request: Request, include_usage: bool):
    """The server-sent events of one streamed answer; aborts the request if cut short."""
    completion = cached = 0
    next_check = time.monotonic() + DISCONNECT_CHECK_S
    try:
        if answer.kind == "chat":
            for i in range(answer.n):
                yield answer.chunk([answer.choice(i, "", None, opening=True)], None,
                                   include_usage)
        async for update in stream:
            completion, cached = update.num_output_tokens, update.num_cached_tokens
            for d in update.deltas:  # one choice per chunk, as OpenAI's server sends them
                # a chunk for every step that made a token, even one with no text yet
                # (bytes held back, or no tokenizer at all), as vLLM's server does
                if d.token_ids or d.text or d.finish_reason:
                    logprobs = answer.logprobs(d) if d.token_ids else None
                    yield answer.chunk([answer.choice(d.index, d.text, d.finish_reason,
                                                      logprobs=logprobs)], None, include_usage)
            if not update.finished and time.monotonic() >= next_check:
                if await request.is_disconnected():
                    return
                next_check = time.monotonic() + DISCONNECT_CHECK_S
        if include_usage:
            yield answer.chunk([], answer.usage(completion, cached), True)
    except (EngineStepError, EngineLoopClosedError) as error:
        yield f"data: {json.dumps(error_body(str(error), 'server_error'))}\n\n"
    finally:
        stream.abort()
    yield "data: [DONE]\n\n"


# %% chapters/17_openai_server.md § Streaming
async def _collect(answer: _Answer, stream) -> dict:
    """The whole answer of a request that is not streamed."""
    whole = [SampleDelta(i, "", [], None, []) for i in range(answer.n)]
    completion = cached = 0
    try:
        async for update in stream:
            completion, cached = update.num_output_tokens, update.num_cached_tokens
            for d in update.deltas:
                sample = whole[d.index]
                sample.text += d.text
                sample.token_ids += d.token_ids
                sample.logprobs += d.logprobs or []
                sample.finish_reason = d.finish_reason or sample.finish_reason
    except (EngineStepError, EngineLoopClosedError) as error:
        raise OpenAIError(503 if isinstance(error, EngineLoopClosedError) else 500,
                          str(error), type="server_error")
    finally:
        stream.abort()
    if answer.kind == "chat":
        choices = [{"index": d.index, "message": {"role": "assistant", "content": d.text},
                    "logprobs": answer.logprobs(d), "finish_reason": d.finish_reason}
                   for d in whole]
    else:
        choices = [answer.choice(d.index, d.text, d.finish_reason, logprobs=answer.logprobs(d))
                   for d in whole]
    return {"id": answer.id, "object": "chat.completion" if answer.kind == "chat"
            else "text_completion", "created": answer.created, "model": answer.model,
            "choices": choices, "usage": answer.usage(completion, cached)}


# %% chapters/17_openai_server.md § The app
class _BodyLimit:
    """ASGI middleware: refuse a request body over ``limit`` bytes (413)."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            response = JSONResponse(error_body(f"the request body is over {self.limit} bytes",
                                               "invalid_request_error"), status_code=413)
            return await response(scope, receive, send)
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise HTTPException(413, f"the request body is over {self.limit} bytes")
            return message

        return await self.app(scope, counted, send)


class _RequireKey:
    """ASGI middleware: every /v1 route needs ``Authorization: Bearer KEY`` (401). Plain ASGI,
    as ``_BodyLimit``: Starlette's ``@app.middleware("http")`` would pass each streamed chunk
    through one more task and memory stream, which at hundreds of streams costs more host
    time than the engine's step."""

    def __init__(self, app, api_key: str) -> None:
        self.app, self.expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                response = JSONResponse(error_body("a valid API key is needed: Authorization: "
                                                   "Bearer KEY", "authentication_error"),
                                        status_code=401)
                return await response(scope, receive, send)
        return await self.app(scope, receive, send)


# %% chapters/17_openai_server.md § The app
def _install_errors(app: FastAPI) -> None:
    """Every error in OpenAI's shape."""

    @app.exception_handler(OpenAIError)
    async def openai_error(request, error: OpenAIError):
        return JSONResponse(error_body(error.message, error.type, error.param, error.code),
                            status_code=error.status, headers=error.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request, error: RequestValidationError):
        first = error.errors()[0] if error.errors() else {}
        where = [str(p) for p in first.get("loc", ()) if p != "body"]
        message = f"{'.'.join(where) or 'body'}: {first.get('msg', 'invalid request')}"
        return JSONResponse(error_body(message, "invalid_request_error",
                                       where[0] if where else None), status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(request, error: HTTPException):
        return JSONResponse(error_body(str(error.detail), "invalid_request_error"),
                            status_code=error.status_code, headers=error.headers)


# %% chapters/17_openai_server.md § The app
def create_app(llm, *, model_name: str = "minipaged", tokenizer=None,
               api_key: str | None = None, max_waiting: int | None = 256,
               max_body_bytes: int = 1 << 20, engine_core: str = "auto") -> FastAPI:
    """An OpenAI-compatible app serving ``llm`` as ``model_name``: an ``LLM`` or
    ``LLMEngine``, or a function that builds one in the engine core process.
    ``engine_core``: ``"process"`` (the engine steps in a process of its own),
    ``"thread"`` (an ``EngineLoop`` thread here), or ``"auto"``: a process, except for an
    engine already on a GPU (a forked child cannot use CUDA). ``max_waiting``: waiting
    requests before new ones get 503."""
    from contextlib import asynccontextmanager

    engine_loop = _engine_owner(llm, engine_core, max_waiting, model_name)
    if isinstance(engine_loop, EngineLoop):  # the metrics live where the engine steps
        engine_loop.metrics = ServerMetrics(model_name)
        engine_loop.observers.append(engine_loop.metrics.observe)

    @asynccontextmanager
    async def lifespan(app):
        engine_loop.start()
        try:
            yield
        finally:
            engine_loop.stop()

    app = FastAPI(title="minipaged", lifespan=lifespan)
    app.state.engine_loop = engine_loop
    app.add_middleware(_BodyLimit, limit=max_body_bytes)
    if api_key is not None:
        app.add_middleware(_RequireKey, api_key=api_key)
    _install_errors(app)

    async def serve(kind: str, body, request: Request):
        if body.model != model_name:
            raise OpenAIError(404, f"the model `{body.model}` does not exist",
                              param="model", code="model_not_found")
        words = tokenizer or engine_loop.tokenizer
        ids = prompt_token_ids(body, words)
        params = sampling_params(body, len(ids), engine_loop.max_model_len)
        if engine_loop.queue_full():
            raise OpenAIError(503, f"{engine_loop.num_waiting} requests are waiting: retry "
                              "later", type="server_error", headers={"Retry-After": "1"})
        try:
            stream = await engine_loop.submit(ids, params)
        except (InvalidRequestError, PromptTooLongError, ValueError, TypeError) as error:
            raise OpenAIError(400, str(error))
        except EngineLoopClosedError as error:
            raise OpenAIError(503, str(error), type="server_error")
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        answer = _Answer(kind, f"{prefix}-{stream.request_id}", model_name, int(time.time()),
                         params.n, len(ids), words, params.logprobs)
        if body.stream:
            usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(_events(answer, stream, request, usage),
                                     media_type="text/event-stream")
        return await _collect(answer, stream)

    _routes(app, serve, model_name, engine_loop)
    return app


# %% chapters/17_openai_server.md § The app
def _engine_owner(llm, engine_core: str, max_waiting: int | None, model_name: str):
    """The engine's one owner: an ``EngineCoreClient`` (a process) or an ``EngineLoop``;
    ``llm`` may be one already (``minipaged serve`` starts its core before the app)."""
    if engine_core not in ("auto", "process", "thread"):
        raise ValueError(f"engine_core={engine_core!r}: one of auto, process, thread")
    if isinstance(llm, (EngineCoreClient, EngineLoop)):
        return llm
    is_engine = hasattr(getattr(llm, "llm_engine", llm), "step")
    if not is_engine:  # a recipe: only a process of its own can run it
        return EngineCoreClient(build=llm, metrics=partial(ServerMetrics, model_name),
                                max_waiting=max_waiting)
    if engine_core == "auto":
        engine_core = "thread" if torch.cuda.is_initialized() else "process"
    if engine_core == "thread":
        return EngineLoop(llm, max_waiting=max_waiting)
    return EngineCoreClient(llm, metrics=partial(ServerMetrics, model_name),
                            max_waiting=max_waiting)


# %% chapters/17_openai_server.md § The app
def _routes(app: FastAPI, serve, model_name: str, engine_loop: EngineLoop) -> None:
    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await serve("completion", body, request)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request):
        return await serve("chat", body, request)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": 0, "owned_by": "minipaged",
            "max_model_len": engine_loop.max_model_len}]}

    @app.get("/health")
    async def health():
        if not engine_loop.alive:
            raise OpenAIError(503, "the engine is not running"
                              + (f": {engine_loop.last_error}" if engine_loop.last_error else ""),
                              type="server_error")
        return {"status": "ok"}

    async def in_engine(fn):  # fn(owner), run where the engine steps, between two steps
        try:
            return await engine_loop.call(fn)
        except EngineLoopClosedError as error:
            raise OpenAIError(503, str(error), type="server_error")

    @app.get("/metrics")
    async def prometheus():
        return Response(await in_engine(render_metrics), media_type="text/plain; version=0.0.4")

    @app.get("/dashboard")
    async def dashboard():
        return HTMLResponse(DASHBOARD_HTML)

    @app.get("/dashboard/state")
    async def dashboard_state():
        return await in_engine(block_pool_state)
