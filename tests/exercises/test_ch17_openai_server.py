"""Checks for the chapter 17 exercises (exercises/ch17_openai_server.py)."""

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.exercises.answers import load, reference

ex = load("ch17_openai_server")


# -- 16.3: the learner's check of a streamed chat answer, graded by planted broken streams ------
#
# The streams are written here, chunk by chunk, in the shape chapter 17's server sends: a chunk
# that opens the assistant's turn, one chunk per step that made a token (an empty delta when the
# step's bytes are held back), the finish_reason on the last one, a usage chunk when asked, and
# `data: [DONE]`. A correct check accepts every well-formed stream (and returns its text) and
# rejects every planted broken one with an AssertionError.

HEAD = {"id": "chatcmpl-7", "object": "chat.completion.chunk", "created": 1767225600,
        "model": "demo"}


def _event(choices, include_usage, usage=None):
    body = {**HEAD, "choices": choices}
    if include_usage:   # then every chunk has the key; only the last one a value
        body["usage"] = usage
    return "data: " + json.dumps(body)


def _choice(delta, finish_reason=None):
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}


def _usage(completion_tokens):
    return {"prompt_tokens": 5, "completion_tokens": completion_tokens,
            "total_tokens": 5 + completion_tokens, "prompt_tokens_details": {"cached_tokens": 0}}


def stream(pieces, finish_reason, include_usage):
    """The lines of a well-formed stream whose steps made the texts ``pieces`` ("" for a step
    whose bytes were held back)."""
    lines = [_event([_choice({"role": "assistant", "content": ""})], include_usage)]
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        lines.append(_event([_choice({"content": piece} if piece else {},
                                     finish_reason if last else None)], include_usage))
    if not pieces:   # stopped at once: the finish_reason in a chunk of its own
        lines.append(_event([_choice({}, finish_reason)], include_usage))
    if include_usage:
        lines.append(_event([], True, _usage(len(pieces))))
    return lines + ["data: [DONE]"]


PLAIN = dict(pieces=["Paged", " blocks", " are", " small"], finish_reason="length",
             include_usage=False)
BYTES = dict(pieces=["Caf", "", "é", " ", "", "", "☕"], finish_reason="length",
             include_usage=True)                 # é is two bytes, ☕ three: held back until whole
STOP = dict(pieces=["Two", " lines", ":\n", "first", ""], finish_reason="stop",
            include_usage=False)                 # a lone "\n" is not the stop string "\n\n"

WELL_FORMED = {   # name: (lines, include_usage, stop, the answer's text)
    "plain": (stream(**PLAIN), False, (), "Paged blocks are small"),
    "usage, bytes held back": (stream(**BYTES), True, (), "Café ☕"),
    "stopped by a stop string": (stream(**STOP), False, ("\n\n",), "Two lines:\nfirst"),
    "stopped at once, with usage": (stream([], "stop", True), True, ("\n\n",), ""),
}


def _without_done():
    return stream(**PLAIN)[:-1]


def _usage_unasked():
    lines = stream(**PLAIN)
    return lines[:-1] + [_event([], True, _usage(4))] + lines[-1:]


def _usage_too_early():
    lines = stream(**BYTES)   # ..., last content chunk, usage, [DONE]
    return lines[:-3] + [lines[-2], lines[-3]] + lines[-1:]


def _usage_missing():
    lines = stream(**BYTES)
    return lines[:-2] + lines[-1:]


def _no_finish_reason():
    return stream(**{**PLAIN, "finish_reason": None})


def _finish_reason_on_every_chunk():
    lines = [_event([_choice({"role": "assistant", "content": ""})], False)]
    lines += [_event([_choice({"content": p}, "length")], False) for p in PLAIN["pieces"]]
    return lines + ["data: [DONE]"]


def _no_role():
    return stream(**PLAIN)[1:]


def _split_character():   # each token's bytes decoded alone
    return stream(**{**BYTES, "pieces": ["Caf", "\ufffd", "\ufffd", " ", "\ufffd", "\ufffd",
                                         "\ufffd"]})


def _stop_string_in_a_chunk():
    return stream(**{**STOP, "pieces": ["Two", " lines", ":\n", "first", "\n\n"]})


def _stop_string_across_chunks():   # no chunk holds "\n\n"; the answer does
    return stream(**{**STOP, "pieces": ["Two", " lines", ":\n", "first\n", "\n"]})


BROKEN = {   # name: (lines, include_usage, stop)
    "no data: [DONE] at the end": (_without_done(), False, ()),
    "a usage chunk that was not asked for": (_usage_unasked(), False, ()),
    "the usage chunk before the last content chunk": (_usage_too_early(), True, ()),
    "include_usage asked, no usage chunk": (_usage_missing(), True, ()),
    "no finish_reason on the last chunk": (_no_finish_reason(), False, ()),
    "a finish_reason on every chunk": (_finish_reason_on_every_chunk(), False, ()),
    "no chunk opens the assistant's turn": (_no_role(), False, ()),
    "a character split into two U+FFFD": (_split_character(), True, ()),
    "the stop string inside a chunk": (_stop_string_in_a_chunk(), False, ("\n\n",)),
    "the stop string across two chunks": (_stop_string_across_chunks(), False, ("\n\n",)),
}


def accepts(check, name):
    lines, include_usage, stop, text = WELL_FORMED[name]
    try:
        got = check(list(lines), include_usage=include_usage, stop=stop)
    except AssertionError as error:
        raise AssertionError(f"your check rejects a well-formed stream ({name}): {error}") from None
    assert got == text, f"{name}: your check returned {got!r}; the answer's text is {text!r}"


def rejects(check, name):
    lines, include_usage, stop = BROKEN[name]
    try:
        check(list(lines), include_usage=include_usage, stop=stop)
    except AssertionError:
        return
    raise AssertionError(f"your check accepts a stream with {name}")


def grade_check_stream(check):
    for name in WELL_FORMED:
        accepts(check, name)
    for name in BROKEN:
        rejects(check, name)


@pytest.mark.parametrize("name", list(WELL_FORMED))
def test_16_3_accepts_a_well_formed_stream(name):
    accepts(ex.check_stream, name)


@pytest.mark.parametrize("name", list(BROKEN))
def test_16_3_rejects_a_broken_stream(name):
    rejects(ex.check_stream, name)


# The grader's own tests: the reference passes, and checks that each miss one rule fail it.

def lax_check(skip):
    """A check of the exercise's rules, less the rule ``skip``."""
    def check(lines, include_usage=False, stop=()):
        if skip != "done":
            assert lines and lines[-1] == "data: [DONE]"
            lines = lines[:-1]
        chunks = [json.loads(line[len("data: "):]) for line in lines if line != "data: [DONE]"]
        rows = [i for i, c in enumerate(chunks) if c["choices"]]
        if skip != "role":
            assert chunks[0]["choices"][0]["delta"].get("role") == "assistant"
        finished = [i for i in rows if chunks[i]["choices"][0]["finish_reason"]]
        if skip == "finish only last":
            assert finished and finished[-1] == rows[-1]
        elif skip != "finish":
            assert finished == rows[-1:]
        usage = [i for i, c in enumerate(chunks) if c.get("usage") is not None]
        if skip == "usage anywhere":
            assert len(usage) == int(include_usage)
        elif skip != "usage":
            assert usage == ([len(chunks) - 1] if include_usage else [])
        if skip == "content always":
            assert all("content" in chunks[i]["choices"][0]["delta"] for i in rows)
        texts = [chunks[i]["choices"][0]["delta"].get("content", "") for i in rows]
        if skip != "fffd":
            assert not any("\ufffd" in t for t in texts)
        if skip == "stop per chunk":
            assert not any(s in t for s in stop for t in texts)
        elif skip != "stop":
            assert not any(s in "".join(texts) for s in stop)
        return "" if skip == "text" else "".join(texts)
    return check


LAX = ["done", "role", "finish", "finish only last", "usage", "usage anywhere", "content always",
       "fffd", "stop", "stop per chunk", "text"]


@pytest.mark.grader
def test_16_3_the_grader_passes_the_reference_and_a_check_of_every_rule():
    grade_check_stream(reference("ch17_openai_server").check_stream)
    grade_check_stream(lax_check(skip=None))


@pytest.mark.grader
@pytest.mark.parametrize("skip", LAX)
def test_16_3_the_grader_rejects_a_check_that_misses_a_rule(skip):
    with pytest.raises(AssertionError):
        grade_check_stream(lax_check(skip))


@pytest.mark.grader
def test_16_3_the_grader_rejects_checks_that_accept_or_reject_everything():
    def accept_all(lines, include_usage=False, stop=()):
        return "".join(json.loads(line[6:])["choices"][0]["delta"].get("content", "")
                       for line in lines if line.startswith("data: {")
                       and json.loads(line[6:])["choices"])

    def reject_all(lines, include_usage=False, stop=()):
        raise AssertionError("no stream is good enough")

    for check in (accept_all, reject_all):
        with pytest.raises(AssertionError):
            grade_check_stream(check)


@pytest.mark.grader
@pytest.mark.parametrize("include_usage", [False, True])
def test_16_3_the_servers_own_streams_are_well_formed(include_usage):
    """What the grader calls well formed is what chapter 17's server sends: its stream of a
    chat answer whose steps made the texts of BYTES passes the grader's check of every rule."""
    from minipaged.entrypoints.engine_bridge import SampleDelta
    from minipaged.entrypoints.openai_server import _Answer, _events

    pieces = BYTES["pieces"]
    updates = [SimpleNamespace(
        deltas=[SampleDelta(0, p, [i], "length" if i == len(pieces) - 1 else None)],
        finished=i == len(pieces) - 1, num_output_tokens=i + 1, num_cached_tokens=0)
        for i, p in enumerate(pieces)]

    class Stream:
        def __aiter__(self):
            return self._updates()

        async def _updates(self):
            for update in updates:
                yield update

        def abort(self):
            pass

    class Request:
        async def is_disconnected(self):
            return False

    async def lines():
        answer = _Answer("chat", "chatcmpl-7", "demo", 1767225600, 1, 5)
        return [e.rstrip("\n") async for e in _events(answer, Stream(), Request(), include_usage)]

    sent = asyncio.run(lines())
    ours = stream(**{**BYTES, "include_usage": include_usage})
    assert lax_check(skip=None)(sent, include_usage=include_usage) == "Café ☕"
    assert len(sent) == len(ours) and sent[-1] == ours[-1]
    assert all(json.loads(a[6:]) == json.loads(b[6:]) for a, b in zip(sent[:-1], ours[:-1]))


@pytest.mark.grader
def test_16_3_the_chapters_example_is_well_formed():
    """The stream the exercise shows is accepted, and its text is the one the exercise names."""
    text = (Path(__file__).resolve().parents[2] / "chapters" / "17_openai_server.md").read_text()
    exercise = text[text.index(":::{exercise} 17.3"):]
    example = exercise[exercise.index("```text\n") + 8:]
    lines = example[:example.index("```")].strip().splitlines()
    assert lines[-1] == "data: [DONE]" and len(lines) == 5
    assert reference("ch17_openai_server").check_stream(lines) == "Café"
    assert lax_check(skip=None)(lines) == "Café"
