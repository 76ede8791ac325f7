"""The OpenAI-compatible server (chapter 17) on a live uvicorn, through the official client: text,
chat, streaming, n, stop strings, log-probabilities, usage with cached tokens, metrics, and every
malformed request answered in OpenAI's error shape while the server keeps serving."""

import json
import os
import time

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from minipaged.engine.llm_engine import LLMEngine  # noqa: E402
from minipaged.entrypoints.openai_server import create_app  # noqa: E402
from minipaged.engine.scheduler import SamplingParams  # noqa: E402
from tests.serving import (SCRIPT, LiveServer, check_pool_state, scripted_model,  # noqa: E402
                           smollm2_tokenizer, tiny_model)

os.environ.setdefault("OMP_NUM_THREADS", "1")
MODEL, MAX_LEN, SEATS = "tiny", 96, 8


@pytest.fixture(scope="module")
def tokenizer():
    return smollm2_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return tiny_model(tokenizer)


def new_llm(model, tokenizer, **kw):
    """Chapter 12's engine: on a CPU its torch sampler is far quicker than chapter 14's fused
    one under Triton's interpreter (tests/test_engine_loop.py serves minipaged.LLM)."""
    settings = dict(tokenizer=tokenizer, block_size=4, num_blocks=160, max_num_seqs=SEATS,
                    max_model_len=MAX_LEN, check_invariants=True)
    settings.update(kw)
    return LLMEngine(model, **settings)


@pytest.fixture(scope="module")
def live(model, tokenizer):
    app = create_app(new_llm(model, tokenizer), model_name=MODEL, max_body_bytes=64 * 1024)
    with LiveServer(app) as server:
        yield server


@pytest.fixture(scope="module")
def client(live):
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_models_and_health(live, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(live.url + "/health").json() == {"status": "ok"}


def test_greedy_stream_equals_the_answer_and_the_offline_engine(client, model, tokenizer):
    prompt = "The paged cache keeps"
    kw = dict(model=MODEL, prompt=prompt, max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(**kw)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text and text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert whole.choices[0].finish_reason == "length"
    offline = new_llm(model, tokenizer).generate(
        [prompt], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False)
    ids = offline[0].outputs[0].token_ids
    assert text == tokenizer.decode(ids, skip_special_tokens=True)
    assert whole.usage.prompt_tokens == len(tokenizer(prompt)["input_ids"])


def test_chat_with_n_samples_and_a_seed(client):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Say hi"}], max_tokens=4,
              temperature=1.0, n=3, seed=7, extra_body={"ignore_eos": True})
    first, again = client.chat.completions.create(**kw), client.chat.completions.create(**kw)
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert [c.message.content for c in first.choices] == [c.message.content for c in again.choices]
    assert first.usage.completion_tokens == 12 and first.choices[0].message.role == "assistant"
    stream = list(client.chat.completions.create(stream=True, **kw))
    texts = ["".join(c.choices[0].delta.content or "" for c in stream
                     if c.choices and c.choices[0].index == i) for i in range(3)]
    assert texts == [c.message.content for c in first.choices]


def test_a_stop_string_cuts_the_text(client):
    kw = dict(model=MODEL, prompt="Stop strings", max_tokens=8, temperature=0,
              extra_body={"ignore_eos": True})
    text = client.completions.create(**kw).choices[0].text
    cut = next(i for i in range(2, len(text) - 1) if text[i] != " ")
    stop = text[cut:cut + 2]
    expected = text[:text.index(stop)]
    got = client.completions.create(stop=[stop], **kw).choices[0]
    assert (got.text, got.finish_reason) == (expected, "stop")
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, stop=stop, **kw))
    assert streamed == expected


def test_a_repeated_prompt_reports_cached_tokens(client):
    prompt = list(range(1000, 1030))  # 30 tokens: 7 full blocks of 4
    kw = dict(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    client.completions.create(**kw)
    usage = client.completions.create(**kw).usage
    assert usage.prompt_tokens == 30 and usage.prompt_tokens_details.cached_tokens >= 24


def test_metrics_parse_and_count_what_was_served(live, client):
    from prometheus_client.parser import text_string_to_metric_families
    for _ in range(2):  # the second finds the first's two full blocks in the prefix cache
        client.completions.create(model=MODEL, prompt=list(range(5, 14)), max_tokens=3,
                                  temperature=0)
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(live.url + "/metrics").text)}
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
                 "prefix_cache_queries", "prefix_cache_hits", "num_preemptions",
                 "time_to_first_token_seconds", "time_per_output_token_seconds",
                 "e2e_request_latency_seconds", "request_success"):
        assert "minipaged:" + name in families, name
    value = lambda fam, suffix: sum(s.value for s in families[fam].samples if s.name.endswith(suffix))  # noqa: E731
    served = value("minipaged:request_success", "_total")
    assert served >= 1
    assert value("minipaged:e2e_request_latency_seconds", "_count") == served
    assert value("minipaged:prefix_cache_queries", "_total") >= value("minipaged:prefix_cache_hits", "_total") > 0
    assert value("minipaged:num_requests_running", "running") == 0


def post(live, body, raw=None, headers=None):
    content = raw if raw is not None else json.dumps(body).encode()
    return httpx.post(live.url + "/v1/completions", content=content, timeout=120,
                      headers={"content-type": "application/json", **(headers or {})})


GOOD = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 2}
BAD = {
    "bad JSON": (None, b'{"model": "tiny", "prompt": ', 400),
    "not an object": (None, b'[1, 2]', 400),
    "missing prompt": ({"model": MODEL}, None, 400),
    "missing model": ({"prompt": "x"}, None, 400),
    "max_tokens a string": ({**GOOD, "max_tokens": "2"}, None, 400),
    "temperature a string": ({**GOOD, "temperature": "hot"}, None, 400),
    "prompt of strings": ({**GOOD, "prompt": [["a"]]}, None, 400),
    "negative max_tokens": ({**GOOD, "max_tokens": -1}, None, 400),
    "zero max_tokens": ({**GOOD, "max_tokens": 0}, None, 400),
    "huge max_tokens": ({**GOOD, "max_tokens": 10**9}, None, 400),
    "negative temperature": ({**GOOD, "temperature": -1}, None, 400),
    "top_p over 1": ({**GOOD, "top_p": 1.5}, None, 400),
    "n beyond the engine": ({**GOOD, "n": SEATS + 1}, None, 400),
    "prompt over max_model_len": ({**GOOD, "prompt": [1] * (MAX_LEN + 1)}, None, 400),
    "token outside the vocabulary": ({**GOOD, "prompt": [1, 49152]}, None, 400),
    "negative token": ({**GOOD, "prompt": [-3]}, None, 400),
    "empty prompt": ({**GOOD, "prompt": ""}, None, 400),
    "stop of numbers": ({**GOOD, "stop": [1]}, None, 400),
    "logprobs over 20": ({**GOOD, "logprobs": 21}, None, 400),
    "negative logprobs": ({**GOOD, "logprobs": -1}, None, 400),
    "unknown model": ({**GOOD, "model": "gpt-5"}, None, 404),
    "body over the limit": (None, json.dumps({**GOOD, "prompt": "x" * 70_000}).encode(), 413),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_malformed_request_gets_an_openai_error_and_the_server_keeps_serving(live, case):
    body, raw, status = BAD[case]
    response = post(live, body, raw)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert post(live, GOOD).json()["usage"]["completion_tokens"] == 2


def test_the_client_raises_the_matching_exceptions(client):
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt=[1], max_tokens=-5)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt=[1], max_tokens=1)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user"}], max_tokens=1)


def test_an_api_key_is_required_and_a_full_queue_answers_503(model, tokenizer):
    import asyncio
    app = create_app(new_llm(model, tokenizer, max_num_seqs=1), model_name=MODEL,
                     api_key="sesame", max_waiting=1)
    with LiveServer(app) as server:
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "sesame"}):
            response = post(server, GOOD, headers=headers)
            assert response.status_code == 401 and response.json()["error"]["type"] == "authentication_error"
        key = {"authorization": "Bearer sesame"}
        assert httpx.get(server.url + "/health").status_code == 200  # outside /v1: no key
        # Long enough (no early EOS, 80 tokens) that the first still runs and the second still
        # waits when the third arrives, however slow or fast the machine is.
        long = {**GOOD, "max_tokens": 80, "ignore_eos": True, "stream": True, "extra": 1}

        async def crowd():
            async with httpx.AsyncClient(base_url=server.url, headers=key, timeout=120) as c:
                first = asyncio.create_task(c.post("/v1/completions", json=long))
                second = None
                for _ in range(600):  # until the first runs: then the second waits
                    await asyncio.sleep(0.05)
                    state = (await c.get("/dashboard/state")).json()
                    if second is None and state["running"]:
                        second = asyncio.create_task(c.post("/v1/completions", json=long))
                    elif second is not None and state["waiting"] and state["running"]:
                        break
                third = await c.post("/v1/completions", json=GOOD)
                return third, await first, await second

        third, first, second = asyncio.run(crowd())
        assert third.status_code == 503 and third.headers["retry-after"] == "1", third.text
        assert third.json()["error"]["type"] == "server_error"
        assert first.status_code == second.status_code == 200
        assert first.text.rstrip().endswith("data: [DONE]")
        assert post(server, GOOD, headers=key).status_code == 200


HELLO = [{"role": "user", "content": "Say hi"}]


def chat_prompt(tokenizer, messages=HELLO):
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


@pytest.fixture(scope="module")
def scripted(tokenizer):
    """A live server whose model writes SCRIPT greedily, token by token, and its prompt."""
    chat = tokenizer(chat_prompt(tokenizer), add_special_tokens=False)["input_ids"]
    model, prompt, ids = scripted_model(tokenizer, also_after=chat[-1:])
    app = create_app(new_llm(model, tokenizer), model_name=MODEL)
    with LiveServer(app) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                               timeout=120)
        yield client, prompt, ids


def scripted_stream(scripted, **kw):
    client, prompt, ids = scripted
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=len(ids),
                                            temperature=0, stream=True, **kw))
    return [c.choices[0].text for c in chunks], chunks[-1].choices[0].finish_reason


def test_a_character_split_across_tokens_arrives_whole_in_the_stream(scripted, tokenizer):
    _, _, ids = scripted
    assert any("\ufffd" in tokenizer.decode([t]) for t in ids)  # the emoji takes two tokens
    texts, reason = scripted_stream(scripted)
    assert "".join(texts) == SCRIPT and reason == "length"
    assert not any("\ufffd" in t for t in texts)
    assert any("😊" in t for t in texts)


@pytest.mark.parametrize("include", [False, True])
def test_a_stop_string_split_across_chunks_never_appears(scripted, tokenizer, include):
    _, _, ids = scripted
    at = next(i for i, t in enumerate(ids) if tokenizer.decode([t]) == ".")
    stop = "s."  # the end of " works" and the next token
    assert tokenizer.decode([ids[at - 1]]).endswith("s")
    texts, reason = scripted_stream(scripted, stop=[stop],
                                    extra_body={"include_stop_str_in_output": include})
    cut = SCRIPT.index(stop) + (len(stop) if include else 0)
    assert "".join(texts) == SCRIPT[:cut] and reason == "stop"
    assert "".join(texts).count(stop) == (1 if include else 0)
    if not include:  # the "s" waited until the "." showed it starts the stop string (a
        # stream that fell behind the engine core gets its last steps merged into one chunk)
        assert [t for t in texts if t][-1].endswith(" work"), texts


def test_chat_logprobs_carry_the_bytes_of_a_split_character(scripted):
    client, _, ids = scripted
    kw = dict(model=MODEL, messages=HELLO, max_tokens=len(ids), temperature=0, logprobs=True,
              top_logprobs=1)
    whole = client.chat.completions.create(**kw).choices[0]
    assert whole.message.content == SCRIPT
    entries = whole.logprobs.content
    assert len(entries) == len(ids) and any("\ufffd" in e.token for e in entries)
    assert bytes(b for e in entries for b in e.bytes).decode() == SCRIPT
    streamed = [e for c in client.chat.completions.create(stream=True, **kw)
                if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.bytes for e in streamed] == [e.bytes for e in entries]


def offline_logprobs(model, tokenizer, prompt, k, max_tokens):
    out = new_llm(model, tokenizer).generate(
        [prompt], SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True,
                                 logprobs=k), use_tqdm=False)[0].outputs[0]
    return out.token_ids, out.logprobs


def test_completions_logprobs_equal_the_engines(client, model, tokenizer):
    prompt, k = "Log probabilities of", 3
    ids, logprobs = offline_logprobs(model, tokenizer, prompt, k, 5)
    kw = dict(model=MODEL, prompt=prompt, max_tokens=5, temperature=0, logprobs=k,
              extra_body={"ignore_eos": True})
    fields = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
    answer = client.completions.create(**kw).choices[0].logprobs
    whole = {f: getattr(answer, f) for f in fields}
    chunks = [c.choices[0].logprobs for c in client.completions.create(stream=True, **kw)
              if c.choices and c.choices[0].logprobs]
    streamed = {f: sum((getattr(c, f) for c in chunks), []) for f in fields}
    for got in (whole, streamed):
        get = got.get
        assert get("tokens") == [tokenizer.decode([t]) for t in ids]
        assert get("token_logprobs") == pytest.approx([lp[t] for t, lp in zip(ids, logprobs)])
        tops = get("top_logprobs")
        assert [len(top) for top in tops] == [k] * 5
        for top, lp in zip(tops, logprobs):
            best = sorted(lp.items(), key=lambda kv: -kv[1])[:k]
            assert top == pytest.approx({tokenizer.decode([u]): v for u, v in best})
        lengths = [len(t) for t in get("tokens")]
        assert get("text_offset") == [sum(lengths[:i]) for i in range(5)]


def test_chat_logprobs_equal_the_engines(client, model, tokenizer):
    messages, k = HELLO, 2
    prompt = tokenizer(chat_prompt(tokenizer), add_special_tokens=False)["input_ids"]
    ids, logprobs = offline_logprobs(model, tokenizer, prompt, k, 4)
    kw = dict(model=MODEL, messages=messages, max_tokens=4, temperature=0, logprobs=True,
              top_logprobs=k, extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**kw).choices[0].logprobs.content
    streamed = [e for c in client.chat.completions.create(stream=True, **kw)
                if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    for got in (whole, streamed):
        assert [e.token for e in got] == [tokenizer.decode([t]) for t in ids]
        assert [e.logprob for e in got] == pytest.approx([lp[t] for t, lp in zip(ids, logprobs)])
        assert all(e.bytes == list(e.token.encode()) for e in got if "\ufffd" not in e.token)
        for e, lp in zip(got, logprobs):
            best = sorted(lp.items(), key=lambda kv: -kv[1])[:k]
            assert [(t.token, t.logprob) for t in e.top_logprobs] == [
                (tokenizer.decode([u]), pytest.approx(v)) for u, v in best]
    plain = client.chat.completions.create(**{**kw, "logprobs": False, "top_logprobs": None})
    assert plain.choices[0].logprobs is None


def test_without_a_tokenizer_every_token_still_streams_as_a_chunk(model):
    """A random model has no tokenizer: its text is empty, yet a load benchmark must see one
    chunk per step (vLLM's server sends a chunk whenever a step made tokens). The steps are paced
    at 0.1 s: a reader that falls behind is sent the steps it missed merged into one chunk, and a
    loaded machine's reader can fall behind a tiny model's sub-millisecond steps."""
    llm = new_llm(model, None)
    step = llm.step

    def paced_step():
        time.sleep(0.1)
        return step()

    llm.step = paced_step
    app = create_app(llm, model_name=MODEL)
    body = {"model": MODEL, "prompt": [5, 6, 7, 8], "max_tokens": 5, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    with LiveServer(app) as server:
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as r:
            events = [json.loads(line[len("data: "):]) for line in r.iter_lines()
                      if line.startswith("data: {")]
    token_chunks = [e for e in events if e["choices"]]
    assert len(token_chunks) == 5, events
    assert [e["choices"][0]["finish_reason"] for e in token_chunks] == [None] * 4 + ["length"]
    assert events[-1]["usage"]["completion_tokens"] == 5
