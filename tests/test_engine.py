"""The engine (chapter 12) end to end on a tiny random Qwen3, against transformers' greedy generate."""

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import minipaged.entrypoints.llm
from minipaged.engine.llm_engine import InvalidRequestError, LLMEngine
from minipaged.model.qwen3 import random_qwen3, reference_greedy, tiny_qwen3_config
from minipaged.engine.scheduler import SamplingParams

NEW = 6


@pytest.fixture(scope="module")
def setup():
    hf = random_qwen3(tiny_qwen3_config(), seed=0, dtype=torch.float32)
    rng = random.Random(0)
    prompts = [[rng.randrange(512) for _ in range(n)] for n in (5, 17, 33, 9, 2)]
    reference, _ = reference_greedy(hf, prompts, NEW)
    assert all(len(set(t)) > 2 for t in reference), "degenerate reference output"
    return hf, prompts, reference


GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True)
ENGINES = pytest.mark.parametrize("engine", [LLMEngine, minipaged.entrypoints.llm.LLM],
                                  ids=["chapter 12", "minipaged.LLM"])


def tokens(outputs):
    return [o.outputs[0].token_ids for o in outputs]


@ENGINES
@pytest.mark.parametrize("caching", [True, False])
def test_greedy_equals_transformers(setup, caching, engine):
    hf, prompts, reference = setup
    llm = engine(hf, block_size=4, enable_prefix_caching=caching, check_invariants=True)
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.prompt_token_ids for o in outputs] == prompts
    assert tokens(outputs) == reference
    assert all(o.finished and o.outputs[0].finish_reason == "length" for o in outputs)
    assert llm.manager.num_sequences == 0


@ENGINES
def test_prefix_caching_hits_and_keeps_outputs(setup, engine):
    hf, prompts, _ = setup
    shared = [prompts[2] + [7, 8, 9], prompts[2] + [10], prompts[2] + [11, 12]]
    reference, _ = reference_greedy(hf, shared, NEW)
    llm = engine(hf, block_size=4, max_num_seqs=1, check_invariants=True)
    assert tokens(llm.generate(shared, GREEDY, use_tqdm=False)) == reference
    assert llm.last_run_stats()["prefix_hit_rate"] > 0.5


@ENGINES
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_tiny_cache_preempts_and_outputs_do_not_change(setup, mode, engine):
    hf, prompts, reference = setup
    llm = engine(hf, block_size=2, num_blocks=24, preemption_mode=mode, check_invariants=True)
    assert tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == reference
    assert llm.last_run_stats()["preemptions"] > 0
    assert llm.manager.num_free_blocks == 24
    assert llm.manager.num_free_cpu_blocks == (24 if mode == "swap" else 0)


def test_cancellations_mid_run(setup):
    hf, prompts, reference = setup
    llm = LLMEngine(hf, block_size=4, max_num_seqs=2, check_invariants=True)
    ids = [llm.add_request(p, GREEDY) for p in prompts]
    llm.step()
    llm.step()
    running, waiting = llm.scheduler.running[0].request_id, llm.scheduler.waiting[-1].request_id
    outputs = {running: llm.abort_request(running), waiting: llm.abort_request(waiting)}
    with pytest.raises(KeyError):
        llm.abort_request(running)
    while llm.has_unfinished_requests():
        outputs.update((o.request_id, o) for o in llm.step())
    for i, ref in zip(ids, reference):
        out = outputs[i].outputs[0]
        if i in (running, waiting):
            assert out.finish_reason == "abort" and out.token_ids == ref[:len(out.token_ids)]
        else:
            assert out.token_ids == ref
    assert llm.manager.num_free_blocks == llm.manager.num_physical_blocks
    assert llm.manager.num_sequences == 0


def test_too_long_prompt_is_refused_alone(setup):
    hf, prompts, reference = setup
    llm = LLMEngine(hf, block_size=4, check_invariants=True)
    too_long = [1] * (hf.config.max_position_embeddings + 1)
    outputs = llm.generate([prompts[0], too_long, prompts[1]], GREEDY, use_tqdm=False)
    assert "max_model_len" in outputs[1].error and outputs[1].outputs == []
    assert [outputs[0].outputs[0].token_ids, outputs[2].outputs[0].token_ids] == reference[:2]
    assert llm.manager.num_free_blocks == llm.manager.num_physical_blocks


def test_failed_forward_leaves_no_trace(setup, monkeypatch):
    hf, prompts, reference = setup
    llm = LLMEngine(hf, block_size=4, check_invariants=True)
    for p in prompts:
        llm.add_request(p, GREEDY)
    llm.step()
    free = llm.manager.num_free_blocks
    original = llm.model.forward
    monkeypatch.setattr(llm.model, "forward", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        llm.step()
    assert llm.manager.num_free_blocks == free and llm.manager.pending_step is None
    llm.scheduler.check_invariants()
    monkeypatch.setattr(llm.model, "forward", original)
    done = []
    while llm.has_unfinished_requests():
        done += llm.step()
    assert [o.outputs[0].token_ids for o in sorted(done, key=lambda o: o.request_id)] == reference


def test_parallel_sampling_is_seeded_and_shares_blocks(setup):
    hf, prompts, _ = setup
    params = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=NEW, ignore_eos=True)
    llm = LLMEngine(hf, block_size=4, check_invariants=True)
    first = llm.generate([prompts[2]], params, use_tqdm=False)[0]
    again = llm.generate([prompts[0], prompts[2]], [GREEDY, params], use_tqdm=False)[1]
    samples = [o.token_ids for o in first.outputs]
    assert [o.index for o in first.outputs] == [0, 1, 2] and all(len(s) == NEW for s in samples)
    assert len({tuple(s) for s in samples}) > 1
    assert [o.token_ids for o in again.outputs] == samples
    assert llm.manager.num_free_blocks == llm.manager.num_physical_blocks


def test_text_prompts_need_a_tokenizer(setup):
    hf, _, _ = setup
    with pytest.raises(TypeError, match="tokenizer"):
        LLMEngine(hf).generate("hello", GREEDY, use_tqdm=False)


def test_text_prompts_and_text_outputs_with_a_tokenizer(setup):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    hf, _, _ = setup
    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(512)}, unk_token="w511"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    words.decoder = decoders.WordPiece()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="w511", eos_token="w0")
    llm = LLMEngine(hf, block_size=4, tokenizer=tokenizer)
    assert llm.eos_token_id == 0
    texts = ["w1 w2 w3", "w40 w41"]
    outputs = llm.generate(texts, GREEDY, use_tqdm=False)
    reference, _ = reference_greedy(hf, [[1, 2, 3], [40, 41]], NEW)
    for out, text, ref in zip(outputs, texts, reference):
        assert out.prompt == text and out.prompt_token_ids == tokenizer(text)["input_ids"]
        assert out.outputs[0].token_ids == ref
        assert out.outputs[0].text == tokenizer.decode(ref)


def test_beam_search_equals_transformers(setup):
    hf, prompts, _ = setup
    llm = LLMEngine(hf, block_size=2)
    for prompt in prompts[:3]:
        ids = torch.tensor([prompt])
        theirs = hf.generate(ids, attention_mask=torch.ones_like(ids), num_beams=3, do_sample=False,
                             num_return_sequences=3, max_new_tokens=NEW, min_new_tokens=NEW,
                             pad_token_id=0, output_scores=True, return_dict_in_generate=True)
        ours = llm.beam_search(prompt, beam_width=3, max_tokens=NEW)[0]
        assert ours.sequences == theirs.sequences[:, len(prompt):].tolist()
        assert torch.allclose(torch.tensor(ours.cumulative_logprobs) / NEW, theirs.sequences_scores, atol=1e-4)
        assert ours.num_cow_copies > 0
        assert llm.manager.num_free_blocks == llm.manager.num_physical_blocks
        assert llm.manager.invariants_ok()


def test_a_failed_beam_step_frees_every_block_and_the_engine_still_works(setup, monkeypatch):
    hf, prompts, _ = setup
    llm = LLMEngine(hf, block_size=2)
    good = llm.beam_search(prompts[1], beam_width=3, max_tokens=NEW)[0]
    original, calls = llm.model.forward, []

    def fail_on_third_step(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("boom")
        return original(*args, **kwargs)

    monkeypatch.setattr(llm.model, "forward", fail_on_third_step)
    with pytest.raises(RuntimeError, match="boom"):
        llm.beam_search(prompts[1], beam_width=3, max_tokens=NEW)
    assert llm.manager.pending_step is None and llm.manager.num_sequences == 0
    assert llm.manager.num_free_blocks == llm.manager.num_physical_blocks
    monkeypatch.setattr(llm.model, "forward", original)
    again = llm.beam_search(prompts[1], beam_width=3, max_tokens=NEW)[0]
    assert again.sequences == good.sequences  # (the prompt now hits the prefix cache)
    assert again.cumulative_logprobs == pytest.approx(good.cumulative_logprobs, abs=1e-4)


def test_the_engine_runs_from_the_reservation_alone(setup, monkeypatch):
    """Every step's block tables come with the scheduler's reservation: the engine never
    asks the block manager for them."""
    hf, prompts, reference = setup
    llm = LLMEngine(hf, block_size=4)

    def refuse(*args, **kwargs):
        raise AssertionError("the engine asked the manager for block tables")

    monkeypatch.setattr(llm.manager, "get_block_table_tensor", refuse)
    assert tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == reference
    assert llm.beam_search(prompts[0], beam_width=2, max_tokens=NEW)


def test_run_stats_count_what_the_roofline_and_latency_metrics_need(setup):
    hf, prompts, reference = setup
    llm = LLMEngine(hf, block_size=4)
    assert tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == reference
    stats = llm.last_run_stats()
    # one prefill step for every prompt, then NEW - 1 decode steps; decode step k reads L + k tokens
    assert stats["steps"] == NEW and stats["prefill_tokens"] == sum(map(len, prompts))
    assert stats["output_tokens"] == NEW * len(prompts) and stats["preemptions"] == 0
    assert stats["kv_tokens_read"] == sum(len(p) + k for p in prompts for k in range(1, NEW))
    assert stats["prefix_hit_rate"] == 0 and stats["graph_steps"] == 0      # no GPU, no graphs
    assert len(llm.stats.ttft) == len(llm.stats.tpot) == len(prompts)
    assert all(t > 0 for t in llm.stats.ttft + llm.stats.tpot)
    assert stats["forward_seconds"] > 0 and stats["schedule_seconds"] > 0


# -- bad input and failed steps (a request is checked before it is queued; a failed
#    generate call leaves the engine as a fresh one) -----------------------------------------

@pytest.mark.parametrize("prompt, params", [
    ([1, 512], GREEDY),                                   # outside the vocabulary (512)
    ([-1, 3], GREEDY),                                    # negative
    ([1.5, 2.0], GREEDY),                                 # not integers
    ([1, 2], SamplingParams(top_k=-5)),                   # -1 and 0 are "off", -5 is wrong
    ([1, 2], SamplingParams(temperature=float("nan"))),
    ([1, 2], SamplingParams(stop_token_ids=(600,))),
    ([1, 2], {"temperature": 0}),                          # not a SamplingParams
])
def test_bad_requests_raise_a_typed_error_and_queue_nothing(setup, prompt, params):
    hf, prompts, reference = setup
    llm = LLMEngine(hf, block_size=4, check_invariants=True)
    with pytest.raises(InvalidRequestError):
        llm.add_request(prompt, params)
    with pytest.raises(InvalidRequestError):
        llm.generate([prompts[0], prompt], [GREEDY, params], use_tqdm=False)
    assert not llm.has_unfinished_requests() and llm.manager.num_sequences == 0
    assert tokens(llm.generate(prompts[:2], GREEDY, use_tqdm=False)) == reference[:2]


def test_off_values_are_accepted(setup):
    hf, prompts, _ = setup
    llm = LLMEngine(hf, block_size=4)
    for params in (SamplingParams(top_k=-1, max_tokens=2), SamplingParams(top_k=0, max_tokens=2),
                   SamplingParams(seed=None, max_tokens=2)):
        out = llm.generate([prompts[0]], params, use_tqdm=False)[0]
        assert out.error is None and len(out.outputs[0].token_ids) == 2


def test_empty_prompt_is_refused_with_an_error(setup):
    hf, prompts, reference = setup
    outputs = LLMEngine(hf, block_size=4).generate([[], prompts[0]], GREEDY, use_tqdm=False)
    assert outputs[0].error and outputs[0].outputs == []
    assert outputs[1].outputs[0].token_ids == reference[0]


def test_a_failed_step_aborts_the_call_and_frees_every_block(setup, monkeypatch):
    hf, prompts, reference = setup
    llm = LLMEngine(hf, block_size=4, check_invariants=True)
    monkeypatch.setattr(llm.model, "forward",
                        lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        llm.generate(prompts, GREEDY, use_tqdm=False)
    assert not llm.has_unfinished_requests() and not llm.requests
    assert llm.manager.num_free_blocks == llm.manager.num_physical_blocks
    monkeypatch.undo()
    assert tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == reference


_good_prompt = st.lists(st.integers(0, 511), min_size=1, max_size=12)
_bad_prompt = st.one_of(
    st.just([]), st.lists(st.integers(512, 10_000), min_size=1, max_size=3),
    st.lists(st.integers(-50, -1), min_size=1, max_size=3),
    st.lists(st.floats(0.5, 9.5), min_size=1, max_size=3),
    st.just([1] * 300))                                    # longer than max_model_len (256)
_params = st.one_of(
    st.builds(SamplingParams, temperature=st.sampled_from([0.0, 0.7, 1.0]),
              top_k=st.sampled_from([-1, 0, 1, 5]), top_p=st.sampled_from([0.5, 1.0]),
              max_tokens=st.integers(1, 3), ignore_eos=st.just(True),
              seed=st.one_of(st.none(), st.integers(0, 100))),
    st.builds(SamplingParams, top_k=st.integers(-20, -2), max_tokens=st.just(2)))


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(calls=st.lists(st.tuples(st.lists(st.one_of(_good_prompt, _bad_prompt), min_size=1,
                                         max_size=3),
                                st.lists(_params, min_size=3, max_size=3),
                                st.booleans()), min_size=1, max_size=3))
def test_random_good_and_bad_calls_leave_the_engine_as_new(engine_for_mixes, calls):
    llm, probe, probe_tokens = engine_for_mixes
    for prompts, params, fail in calls:
        if fail:   # a step that raises, whatever the requests
            llm.model.forward = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom"))
        try:
            outputs = llm.generate(prompts, params[:len(prompts)], use_tqdm=False)
        except (InvalidRequestError, RuntimeError):
            pass
        else:
            assert len(outputs) == len(prompts)
            if fail:                 # no step can have run: every prompt was refused
                assert all(o.error for o in outputs)
            for out in outputs:
                assert out.error is not None or all(
                    1 <= len(c.token_ids) <= 3 for c in out.outputs)
        finally:
            if fail:
                del llm.model.forward
        assert not llm.has_unfinished_requests() and llm.manager.num_sequences == 0
        assert llm.manager.num_free_blocks == llm.manager.num_physical_blocks
        llm.scheduler.check_invariants()
    assert tokens(llm.generate([probe], GREEDY, use_tqdm=False)) == [probe_tokens]


@pytest.fixture(scope="module")
def engine_for_mixes(setup):
    hf, prompts, reference = setup
    llm = LLMEngine(hf, block_size=4, num_blocks=128, max_model_len=256, check_invariants=True)
    return llm, prompts[1], reference[1]


@ENGINES
def test_n_siblings_count_as_seats_before_they_fork(setup, engine):
    """Requests with n > 1 fork at their first token: admission counts those seats first, so
    the running batch never holds more than max_num_seqs sequences (invariants each step)."""
    hf, prompts, _ = setup
    params = SamplingParams(temperature=0.8, seed=1, n=3, max_tokens=3, ignore_eos=True)
    llm = engine(hf, block_size=4, num_blocks=64, max_num_seqs=4, check_invariants=True)
    outputs = llm.generate(prompts[:3], params, use_tqdm=False)
    assert [len(o.outputs) for o in outputs] == [3, 3, 3]
    assert max(s.num_running for s in llm.scheduler.timeline) <= 4
    with pytest.raises(InvalidRequestError, match="max_num_seqs"):
        llm.add_request(prompts[0], SamplingParams(n=5))
    assert not llm.has_unfinished_requests()
