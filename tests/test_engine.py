"""The engine (chapter 11) end to end on a tiny random Qwen3, against transformers' greedy generate."""

import random

import pytest
import torch

from minipaged.engine import LLM
from minipaged.qwen3 import random_qwen3, reference_greedy, tiny_qwen3_config
from minipaged.scheduler import SamplingParams

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


def tokens(outputs):
    return [o.outputs[0].token_ids for o in outputs]


@pytest.mark.parametrize("caching", [True, False])
def test_greedy_equals_transformers(setup, caching):
    hf, prompts, reference = setup
    llm = LLM(hf, block_size=4, enable_prefix_caching=caching, check_invariants=True)
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.prompt_token_ids for o in outputs] == prompts
    assert tokens(outputs) == reference
    assert all(o.finished and o.outputs[0].finish_reason == "length" for o in outputs)
    assert llm.manager.num_sequences == 0


def test_prefix_caching_hits_and_keeps_outputs(setup):
    hf, prompts, _ = setup
    shared = [prompts[2] + [7, 8, 9], prompts[2] + [10], prompts[2] + [11, 12]]
    reference, _ = reference_greedy(hf, shared, NEW)
    llm = LLM(hf, block_size=4, max_num_seqs=1, check_invariants=True)
    assert tokens(llm.generate(shared, GREEDY, use_tqdm=False)) == reference
    assert llm.last_run_stats()["prefix_hit_rate"] > 0.5


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_tiny_cache_preempts_and_outputs_do_not_change(setup, mode):
    hf, prompts, reference = setup
    llm = LLM(hf, block_size=2, num_blocks=24, preemption_mode=mode, check_invariants=True)
    assert tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == reference
    assert llm.last_run_stats()["preemptions"] > 0
    assert llm.manager.num_free_blocks == 24
    assert llm.manager.num_free_cpu_blocks == (24 if mode == "swap" else 0)


def test_cancellations_mid_run(setup):
    hf, prompts, reference = setup
    llm = LLM(hf, block_size=4, max_num_seqs=2, check_invariants=True)
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
    llm = LLM(hf, block_size=4, check_invariants=True)
    too_long = [1] * (hf.config.max_position_embeddings + 1)
    outputs = llm.generate([prompts[0], too_long, prompts[1]], GREEDY, use_tqdm=False)
    assert "max_model_len" in outputs[1].error and outputs[1].outputs == []
    assert [outputs[0].outputs[0].token_ids, outputs[2].outputs[0].token_ids] == reference[:2]
    assert llm.manager.num_free_blocks == llm.manager.num_physical_blocks


def test_failed_forward_leaves_no_trace(setup, monkeypatch):
    hf, prompts, reference = setup
    llm = LLM(hf, block_size=4, check_invariants=True)
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
    llm = LLM(hf, block_size=4, check_invariants=True)
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
        LLM(hf).generate("hello", GREEDY, use_tqdm=False)


def test_text_prompts_and_text_outputs_with_a_tokenizer(setup):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    hf, _, _ = setup
    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(512)}, unk_token="w511"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    words.decoder = decoders.WordPiece()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="w511", eos_token="w0")
    llm = LLM(hf, block_size=4, tokenizer=tokenizer)
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
    llm = LLM(hf, block_size=2)
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


def test_run_stats_count_what_the_roofline_and_latency_metrics_need(setup):
    hf, prompts, reference = setup
    llm = LLM(hf, block_size=4)
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
