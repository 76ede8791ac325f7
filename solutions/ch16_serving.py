"""Chapter 16 exercises: reference solutions."""


def abort_disconnected(engine, live: dict[str, str], gone: set[str]) -> int:
    """Exercise 16.1: abort and forget each request of ``gone`` still in ``live``."""
    aborted = 0
    for request_id in sorted(gone):
        engine_id = live.pop(request_id, None)
        if engine_id is None:  # it finished before its client left: nothing to free
            continue
        engine.abort_request(engine_id)
        aborted += 1
    return aborted
