"""Chapter 17 exercises: reference solutions."""

import json


def check_stream(lines: list[str], include_usage: bool = False,
                 stop: tuple[str, ...] = ()) -> str:
    """Exercise 17.3: the answer's text if the stream of a chat answer is well formed."""
    assert lines and lines[-1] == "data: [DONE]", "the stream must end with data: [DONE]"
    chunks = []
    for line in lines[:-1]:
        assert line.startswith("data: ") and line != "data: [DONE]", f"not a chunk: {line!r}"
        chunks.append(json.loads(line[len("data: "):]))
    rows = [i for i, chunk in enumerate(chunks) if chunk["choices"]]   # chunks with a choice
    assert rows and rows[0] == 0, "the first chunk must carry a choice"
    deltas = [chunks[i]["choices"][0]["delta"] for i in rows]
    assert deltas[0].get("role") == "assistant", "the first chunk must open the assistant's turn"
    finished = [i for i in rows if chunks[i]["choices"][0].get("finish_reason")]
    assert finished == [rows[-1]], (f"one finish_reason, on the last chunk with a choice "
                                    f"(chunk {rows[-1]}); found on chunks {finished}")
    usage = [i for i, chunk in enumerate(chunks) if chunk.get("usage") is not None]
    if include_usage:   # after the last choice, right before [DONE], with no choice of its own
        assert usage == [len(chunks) - 1] and rows[-1] < usage[0], \
            f"one usage chunk, the last before [DONE]; found at {usage} of {len(chunks)}"
    else:
        assert not usage, "a usage chunk that was not asked for"
    texts = [delta.get("content") or "" for delta in deltas]   # a held-back step: no content
    assert not any("\ufffd" in text for text in texts), \
        "a character split between two chunks (U+FFFD in a chunk)"
    text = "".join(texts)
    for s in stop:   # in the whole answer: a stop string may arrive across two chunks
        assert s not in text, f"the stop string {s!r} leaked into the answer"
    return text
