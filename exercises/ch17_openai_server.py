"""Chapter 17 exercises: an OpenAI-compatible server.

Replace each `raise NotImplementedError(...)` with your answer, then run `make check-exercises`.
"""

import json  # noqa: F401  (you will want it)


def check_stream(lines: list[str], include_usage: bool = False,
                 stop: tuple[str, ...] = ()) -> str:
    """Exercise 17.3: ``lines`` are the non-blank lines of one streamed chat answer (``n = 1``);
    ``include_usage`` and ``stop`` are what its request asked for. Return the answer's text
    (every delta's ``content``, joined) if the stream is well formed; raise AssertionError
    (an ``assert`` that fails) if it breaks one of the exercise's rules."""
    raise NotImplementedError("Exercise 17.3: write assertions that a broken stream fails "
                              "(edit exercises/ch17_openai_server.py, check_stream)")
