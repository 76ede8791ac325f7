# GENERATED from chapters/16_serving.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/16_serving.md § From token ids to text, incrementally
"""Everything the server needs from the engine's request API, in one place.

The engine takes prompts and ``SamplingParams`` (stop strings and log-probabilities
included) under string request ids, ``request_output(id)`` reports a running request's
text so far, and ``step()`` returns the requests that finished. ``EngineBridge`` turns
that into per-step deltas; nothing else in the server calls the engine's request
methods.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from minipaged.engine.llm_engine import completion_tail

__all__ = ["SampleDelta", "RequestProgress", "EngineBridge", "EngineStats", "engine_stats"]


@dataclass
class SampleDelta:
    """New text, token ids and log-probabilities of one sample (``index`` of ``n``) since
    the last step. ``logprobs`` holds one ``{token_id: logprob}`` per new token (the
    sampled one and the ``k`` most likely), or is None when none were asked for."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    logprobs: list[dict[int, float]] | None = None

    @property
    def num_new_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class RequestProgress:
    """What one step changed for one request."""

    request_id: str
    deltas: list[SampleDelta]
    finished: bool
    num_cached_tokens: int = 0
    metrics: dict | None = None  # the engine's timings, once finished
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0   # all samples so far
    longest_sample: int = 0      # tokens of the longest sample so far


@dataclass
class _Tracked:
    sent: dict  # sample index -> [tokens sent, characters sent]
    num_prompt_tokens: int
    ended: set = field(default_factory=set)  # samples whose finish reason was sent


# %% chapters/16_serving.md § From token ids to text, incrementally
class EngineBridge:
    """The engine's request API as a server needs it: per-step text deltas of every running
    request under the server's string ids. Called from the engine loop's thread only."""

    def __init__(self, engine, tokenizer) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.requests: dict[str, _Tracked] = {}

    def add(self, request_id: str, prompt_ids: list[int], params) -> None:
        """Queue a request; raises what the engine raises (``InvalidRequestError`` for an id
        in use), and then nothing is queued."""
        self.engine.add_request(list(prompt_ids), params, request_id=request_id)
        self.requests[request_id] = _Tracked({i: [0, 0] for i in range(params.n)},
                                             len(prompt_ids))

    def abort(self, request_id: str) -> bool:
        """Cancel a request now (the engine frees its blocks); False if it is not here."""
        if self.requests.pop(request_id, None) is None:
            return False
        try:
            self.engine.abort_request(request_id)
        except KeyError:  # the engine had already forgotten it
            pass
        return True

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished_requests()

    def step(self) -> list[RequestProgress]:
        """One engine step; what it changed, per request that changed."""
        finished = {o.request_id: o for o in self.engine.step()}
        running = self.engine.request_outputs(  # one call for every stream still open
            {r: t.sent for r, t in self.requests.items() if r not in finished})
        running = {o.request_id: o for o in running}
        progress = []
        for request_id, tracked in list(self.requests.items()):
            out = finished.get(request_id)
            if out is not None:  # the whole output: keep what was not sent yet
                out = replace(out, outputs=[completion_tail(c, *tracked.sent[c.index])
                                            for c in out.outputs])
            elif (out := running.get(request_id)) is None:  # unknown to the engine now
                continue
            update = self._progress(request_id, tracked, out)
            if update.deltas or update.finished:
                progress.append(update)
        return progress

    # %% chapters/16_serving.md § From token ids to text, incrementally
    def _progress(self, request_id: str, tracked: _Tracked, out) -> RequestProgress:
        """The deltas of one request's samples since the last step (``out`` holds only what is
        new); forget the request once finished."""
        deltas = []
        for c in out.outputs:
            text, new = c.text or "", c.token_ids
            reason = None if c.index in tracked.ended else c.finish_reason
            if reason is not None:  # its last token has arrived: this sample is done
                tracked.ended.add(c.index)
            if text or new or reason:
                deltas.append(SampleDelta(c.index, text, list(new), reason, c.logprobs))
            sent = tracked.sent[c.index]
            sent[0], sent[1] = sent[0] + len(new), sent[1] + len(text)
        if out.finished:
            del self.requests[request_id]
        counts = [s[0] for s in tracked.sent.values()]
        return RequestProgress(request_id, deltas, out.finished,
                               out.metrics.get("num_cached_tokens", 0),
                               out.metrics if out.finished else None, tracked.num_prompt_tokens,
                               sum(counts), max(counts))


# %% chapters/16_serving.md § From token ids to text, incrementally
@dataclass
class EngineStats:
    """What the server's metrics read of the engine after a step (all plain numbers)."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    num_preemptions: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0


def engine_stats(engine) -> EngineStats:
    """The engine's queues, block-pool usage and counters, read between two steps."""
    scheduler, manager = engine.scheduler, engine.manager
    cache = getattr(manager, "stats", None)
    return EngineStats(
        len({s.request_id for s in scheduler.running}),
        len({s.request_id for s in (*scheduler.waiting, *scheduler.swapped)}),
        1 - manager.num_free_blocks / manager.num_physical_blocks,
        engine.stats.preemptions, getattr(cache, "queries", 0), getattr(cache, "hits", 0))
