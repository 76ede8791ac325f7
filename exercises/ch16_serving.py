"""Chapter 16 exercises: serving online.

Replace each `raise NotImplementedError(...)` with your answer, then run `make check-exercises`.
"""


def abort_disconnected(engine, live: dict[str, str], gone: set[str]) -> int:
    """Exercise 16.1: abort in ``engine`` every request of ``gone`` that ``live`` (the server's
    request id -> the engine's) still holds, and forget it there; ids not in ``live`` (finished
    already) are ignored. Returns how many were aborted."""
    raise NotImplementedError("Exercise 16.1: abort the requests whose client went away "
                              "(edit exercises/ch16_serving.py, abort_disconnected)")
