# GENERATED from chapters/11_model_runner.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/11_model_runner.md § Text out: the incremental detokenizer
"""Incremental detokenization: the text of a growing list of token ids, stop strings."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["IncrementalDetokenizer"]

REPLACEMENT = "\ufffd"  # what a decoder writes for bytes that are not (yet) a character


class IncrementalDetokenizer:
    """The text of one generated sequence, fed a few token ids at a time.

    ``push(ids)`` returns the text that became final: a character whose UTF-8 bytes are
    split across byte-level tokens comes out whole once its last byte arrives, never as
    U+FFFD. Each push decodes a small window (the tokens since the last complete
    character, plus the ones before them as context, vLLM's prefix and read offsets),
    so its cost does not grow with the output. After ``finish()``, ``text`` equals
    ``tokenizer.decode(ids, skip_special_tokens=True)`` of everything pushed.

    ``stop`` strings end the text at the first one to appear, even across token
    boundaries (``stop_reason`` says which); it is kept in ``text`` if
    ``include_stop_str_in_output``. Until then ``text`` holds back a tail that could
    still begin a stop string, so that the text a reader sees only ever grows.
    """

    def __init__(self, tokenizer, stop: Iterable[str] = (),
                 include_stop_str_in_output: bool = False) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.include_stop_str_in_output = include_stop_str_in_output
        self._special = frozenset(getattr(tokenizer, "all_special_ids", ()) or ())
        self._window: list[int] = []  # the ids not yet final, after their context
        self._read = 0                # window[:_read] is context, already in _text
        self._text = ""               # final text so far, before any stop cut
        self._end: int | None = None  # where a stop string cut the text
        self.num_tokens = 0           # token ids pushed, special ones included
        self.stop_reason: str | None = None
        self.finished = False

    @property
    def text(self) -> str:
        """The text a reader may see now (all of it after ``finish``)."""
        if self._end is not None:
            return self._text[:self._end]
        if self.finished or self.include_stop_str_in_output:
            return self._text
        return self._text[:len(self._text) - self._partial_stop()]

    # %% chapters/11_model_runner.md § Text out: the incremental detokenizer
    def push(self, token_ids: Iterable[int]) -> str:
        """Feed the next token ids; returns what they added to ``text``."""
        before = len(self.text)
        for token in token_ids:
            self.num_tokens += 1
            if token not in self._special:
                self._window.append(int(token))
        if self.stop_reason is None and not self.finished:
            self._decode(final=False)
        return self.text[before:]

    def finish(self) -> str:
        """The sequence ended: flush the text held back; returns what it added."""
        before = len(self.text)
        if self.stop_reason is None and not self.finished:
            self._decode(final=True)
        self.finished = True
        return self.text[before:]

    def _decode(self, final: bool) -> None:
        window, read = self._window, self._read
        if len(window) == read:
            return
        decode = self.tokenizer.decode
        context = decode(window[:read], skip_special_tokens=True) if read else ""
        text = decode(window, skip_special_tokens=True)
        if not final and (len(text) <= len(context) or text.endswith(REPLACEMENT)):
            return  # an incomplete character at the end: wait for its next bytes
        start = len(self._text)
        self._text += text[len(context):]
        self._window, self._read = window[read:], len(window) - read
        self._find_stop(start)

    # %% chapters/11_model_runner.md § Text out: the incremental detokenizer
    def _find_stop(self, start: int) -> None:
        """Cut the text at the first stop string ending after ``start`` (new text)."""
        if not self.stop:
            return
        text, best = self._text, None
        for word in self.stop:
            i = text.find(word, max(0, start - len(word) + 1))
            if i >= 0 and (best is None or (i + len(word), i) < best[:2]):
                best = (i + len(word), i, word)
        if best is not None:
            end, i, self.stop_reason = best
            self._end = end if self.include_stop_str_in_output else i

    def _partial_stop(self) -> int:
        """The length of the longest tail of the text that begins a stop string."""
        text, longest = self._text, 0
        for word in self.stop:
            for k in range(min(len(word) - 1, len(text)), longest, -1):
                if text.endswith(word[:k]):
                    longest = k
                    break
        return longest
