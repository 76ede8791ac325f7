# GENERATED from chapters/14_serving.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/14_serving.md § From token ids to text, incrementally
"""Everything the server needs from the engine's request API, in one place.

The engine takes token-id prompts and ``SamplingParams``, names requests by int, and
``step()`` returns the requests that finished. A server needs more: string request ids,
each running request's new tokens after every step, text that grows as tokens come, and
stop strings. ``EngineBridge`` adds them on top of the engine; nothing else in the
server calls the engine's request methods.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ServerDetokenizer", "StopStringFilter", "SampleDelta", "RequestProgress",
           "EngineBridge"]


class ServerDetokenizer:
    """Text of a growing list of token ids, returned as deltas that only ever append.

    ``push(ids)`` returns the new text; it returns ``""`` while the tokens decoded so far
    end inside a character (``"\\ufffd"``), and ``flush()`` returns what is left at the end.
    """

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.text = ""
        self._prefix = 0  # the window starts here: context for the first new token
        self._read = 0    # tokens already turned into text

    def _decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:  # token ids only: no text to stream
            return ""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def push(self, new_ids: list[int], final: bool = False) -> str:
        self.token_ids.extend(new_ids)
        before = self._decode(self.token_ids[self._prefix:self._read])
        after = self._decode(self.token_ids[self._prefix:])
        if (after.endswith("\ufffd") and not final) or len(after) <= len(before):
            return ""
        if not after.startswith(before):  # the window changed its mind: decode it all
            delta = self._decode(self.token_ids)[len(self.text):]
        else:
            delta = after[len(before):]
        self._prefix, self._read = self._read, len(self.token_ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """The text still held back (a trailing partial character) once no token comes."""
        return self.push([], final=True)


# %% chapters/14_serving.md § From token ids to text, incrementally
class StopStringFilter:
    """Cut a text stream at the first stop string, holding back what might start one.

    ``feed(delta)`` returns the text that is safe to send; after a stop string was seen it
    returns ``""`` for ever (``stopped`` is True). ``include`` keeps the stop string.
    """

    def __init__(self, stop: list[str], include: bool = False) -> None:
        self.stop = [s for s in stop if s]
        self.include = include
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.pending = ""
        self.stopped = False

    def feed(self, delta: str, final: bool = False) -> str:
        if self.stopped:
            return ""
        text = self.pending + delta
        hits = [(text.find(s), s) for s in self.stop if s in text]
        if hits:
            at, stop = min(hits)
            self.stopped, self.pending = True, ""
            return text[:at + (len(stop) if self.include else 0)]
        keep = 0 if final else min(self.hold, len(text))
        self.pending = text[len(text) - keep:]
        return text[:len(text) - keep]


# %% chapters/14_serving.md § From token ids to text, incrementally
@dataclass
class SampleDelta:
    """New text of one sample (``index`` of ``n``) since the last step."""

    index: int
    text: str
    num_new_tokens: int
    finish_reason: str | None = None


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
    engine_id: int
    samples: dict  # index -> [detokenizer, stop filter, tokens seen, finish reason]
    num_prompt_tokens: int


def _live(seq) -> tuple[int, list[int], str | None]:
    """(index, tokens, finish reason) of a sequence of a running request. A token still on
    the GPU (a negative placeholder) is left out, and the sequence is not finished until it
    has arrived."""
    ids = seq.output_token_ids
    if ids and ids[-1] < 0:
        return seq.sample_index, ids[:-1], None
    return seq.sample_index, ids, seq.finish_reason


# %% chapters/14_serving.md § From token ids to text, incrementally
SUPPORTS_LOGPROBS = False
"""Whether the engine reports log-probabilities of the sampled tokens (the server refuses
``logprobs`` while it does not)."""


class EngineBridge:
    """The engine's request API as a server needs it: string ids, per-step text deltas of
    every running request, stop strings. Called from the engine loop's thread only."""

    def __init__(self, engine, tokenizer) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.requests: dict[str, _Tracked] = {}
        self._names: dict[int, str] = {}  # the engine's request id -> ours

    def add(self, request_id: str, prompt_ids: list[int], params, stop=(),
            include_stop: bool = False) -> None:
        """Queue a request; raises what the engine raises, and then nothing is queued."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        engine_id = self.engine.add_request(list(prompt_ids), params)
        samples = {i: [ServerDetokenizer(self.tokenizer),
                       StopStringFilter(list(stop), include_stop), 0, None]
                   for i in range(params.n)}
        self.requests[request_id] = _Tracked(engine_id, samples, len(prompt_ids))
        self._names[engine_id] = request_id

    def abort(self, request_id: str) -> bool:
        """Cancel a request now (the engine frees its blocks); False if it is not here."""
        tracked = self.requests.pop(request_id, None)
        if tracked is None:
            return False
        del self._names[tracked.engine_id]
        try:
            self.engine.abort_request(tracked.engine_id)
        except KeyError:  # the engine had already forgotten it
            pass
        return True

    def name_of(self, engine_id: int) -> str | None:
        """Our id of the engine's request ``engine_id`` (for the dashboard)."""
        return self._names.get(engine_id)

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished_requests()

    def step(self) -> list[RequestProgress]:
        """One engine step; what it changed, per request that changed."""
        finished = {o.request_id: o for o in self.engine.step()}
        progress = []
        for name, tracked in list(self.requests.items()):
            out = finished.pop(tracked.engine_id, None)
            if out is not None:
                seqs = [(c.index, c.token_ids, c.finish_reason) for c in out.outputs]
            else:
                request = self.engine.requests.get(tracked.engine_id)
                seqs = [] if request is None else [_live(s) for s in request.seqs]
            update = self._progress(name, tracked, seqs, out)
            if update.deltas or update.finished:
                progress.append(update)
        return progress

    # %% chapters/14_serving.md § From token ids to text, incrementally
    def _progress(self, name: str, tracked: _Tracked, seqs: list, out) -> RequestProgress:
        """Turn the tokens of one request's samples into text deltas; finish the request once
        every sample is done (a stop string ends a sample the engine still runs)."""
        deltas = []
        for index, token_ids, reason in seqs:
            sample = tracked.samples[index]
            detok, stops, seen, done = sample
            if done is not None:
                continue
            new, sample[2] = token_ids[seen:], len(token_ids)
            text = stops.feed(detok.push(new, final=reason is not None), final=reason is not None)
            if stops.stopped:
                reason = "stop"
            sample[3] = reason
            if text or new or reason:
                deltas.append(SampleDelta(index, text, len(new), reason))
        finished = all(s[3] is not None for s in tracked.samples.values())
        if finished:
            del self.requests[name], self._names[tracked.engine_id]
            if out is None:  # stopped by stop strings while the engine ran it: free it now
                out = self.engine.abort_request(tracked.engine_id)
        metrics = out.metrics if out is not None else {}
        counts = [s[2] for s in tracked.samples.values()]
        return RequestProgress(name, deltas, finished, metrics.get("num_cached_tokens", 0),
                               metrics if finished else None, tracked.num_prompt_tokens,
                               sum(counts), max(counts))
