"""Chapter 15's overlap scheduling: a decode step planned and committed before the previous step's
tokens are read gives exactly what the synchronous engine gives, and leaves nothing behind."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minipaged.engine.overlap_scheduler import UNRESOLVED, OverlapScheduler
from minipaged.entrypoints.llm import LLM
from minipaged.engine.scheduler import SamplingParams
from tests.test_engine import NEW, setup  # noqa: F401  (the tiny model, prompts, greedy reference)


def served(hf, prompts, params, overlap, **kw):
    llm = LLM(hf, overlap_scheduling=overlap, check_invariants=True, **kw)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.manager.num_free_blocks == llm.manager.num_physical_blocks
    assert not llm.has_unfinished_requests() and getattr(llm.llm_engine.loop, 'launched', None) is None
    got = [[(c.token_ids, c.finish_reason) for c in o.outputs] for o in outputs]
    assert UNRESOLVED not in [t for o in got for ids, _ in o for t in ids]
    return got, llm


def test_the_engine_uses_the_overlap_scheduler(setup):
    hf, prompts, reference = setup
    greedy = SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True)
    got, llm = served(hf, prompts, greedy, True, block_size=4, num_blocks=256)
    assert isinstance(llm.scheduler, OverlapScheduler)
    assert [o[0][0] for o in got] == [r[:NEW] for r in reference]
    assert llm.overlapped_steps >= NEW - 2  # every step after the prefill and the first


def test_a_stop_token_at_max_tokens_reports_stop(setup):
    """The last token is resolved after the commit ended the sequence at max_tokens."""
    hf, prompts, reference = setup
    params = SamplingParams(temperature=0.0, max_tokens=NEW, stop_token_ids=[reference[0][NEW - 1]])
    got, llm = served(hf, prompts[:1], params, True, block_size=4, num_blocks=256)
    want, _ = served(hf, prompts[:1], params, False, block_size=4, num_blocks=256)
    assert got == want and got[0][0][1] == "stop" and llm.overlapped_steps > 0


def test_a_cancellation_with_a_step_in_flight(setup):
    hf, prompts, reference = setup
    llm = LLM(hf, block_size=4, num_blocks=256, check_invariants=True)
    greedy = SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True)
    ids = [llm.add_request(p, greedy) for p in prompts]
    while getattr(llm.llm_engine.loop, 'launched', None) is None:
        assert llm.step() == []
    out = llm.abort_request(ids[1])
    assert out.outputs[0].finish_reason == "abort" and UNRESOLVED not in out.outputs[0].token_ids
    assert out.outputs[0].token_ids == reference[1][:len(out.outputs[0].token_ids)]
    finished = {}
    while llm.has_unfinished_requests():
        finished.update((o.request_id, o) for o in llm.step())
    assert sorted(finished) == [i for i in ids if i != ids[1]]
    assert all(finished[i].outputs[0].token_ids == reference[k][:NEW]
               for k, i in enumerate(ids) if i != ids[1])
    assert llm.manager.num_free_blocks == llm.manager.num_physical_blocks


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_overlap_gives_what_the_synchronous_engine_gives(setup, data):
    """Random requests (greedy with stop tokens the model draws, seeded samples with n > 1, mixed
    max_tokens), caches from roomy to preempting, prefix caching on and off."""
    hf, prompts, reference = setup
    picked = data.draw(st.lists(st.sampled_from(range(len(prompts))), min_size=1, max_size=4))
    params = []
    for k in picked:
        max_tokens = data.draw(st.integers(1, NEW))
        if data.draw(st.booleans()):
            stop = data.draw(st.sampled_from(reference[k]))
            params.append(SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                         stop_token_ids=[stop]))
        else:
            params.append(SamplingParams(temperature=0.9, seed=data.draw(st.integers(0, 9)),
                                         n=data.draw(st.integers(1, 2)), max_tokens=max_tokens))
    kw = dict(block_size=data.draw(st.sampled_from([2, 4])),
              num_blocks=data.draw(st.sampled_from([24, 40, 256])),
              enable_prefix_caching=data.draw(st.booleans()),
              preemption_mode=data.draw(st.sampled_from(["recompute", "swap"])))
    chosen = [prompts[k] for k in picked]
    want, _ = served(hf, chosen, params, False, **kw)
    got, _ = served(hf, chosen, params, True, **kw)
    assert got == want


def test_a_failed_overlapped_step_frees_everything_and_the_engine_serves_again(setup, monkeypatch):
    """The forward of an overlapped step fails while the previous step is in flight: the call
    raises, every block comes back, and the next call is served as if nothing had happened."""
    hf, prompts, reference = setup
    llm = LLM(hf, block_size=4, num_blocks=256, check_invariants=True)
    greedy = SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True)
    runner = llm.llm_engine.runner
    real, calls = runner.decode, []

    def fail_on_the_third(out, input_ids):
        calls.append(out)
        if len(calls) == 3:
            raise RuntimeError("boom")
        return real(out, input_ids)

    monkeypatch.setattr(runner, "decode", fail_on_the_third)
    with pytest.raises(RuntimeError, match="boom"):
        llm.generate(prompts, greedy, use_tqdm=False)
    assert not llm.has_unfinished_requests() and not llm.llm_engine.requests and getattr(llm.llm_engine.loop, 'launched', None) is None
    assert llm.manager.num_free_blocks == llm.manager.num_physical_blocks
    llm.scheduler.check_invariants()
    monkeypatch.undo()
    outputs = llm.generate(prompts, greedy, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == [r[:NEW] for r in reference]


class _TokenRule(torch.nn.Module):
    """A stand-in model whose next token is a fixed function of the input token and its
    position: fast, and any input fed wrongly (a placeholder, another row's token) changes
    the outputs."""

    def __init__(self, model):
        super().__init__()
        self.inner = model
        self.vocab = model.config.vocab_size

    def forward(self, batch, cache):
        rows = batch.logits_indices.to(batch.input_ids.device)
        ids, positions = batch.input_ids[rows], batch.positions.to(rows.device)[rows]
        assert (ids >= 0).all(), "a placeholder reached the model"
        logits = torch.zeros(len(rows), self.vocab)
        logits[torch.arange(len(rows)), (ids * 31 + positions * 7 + 1) % 64] = 4.0
        return logits

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("inner"), name)


def _served_by_rule(hf, prompts, params, overlap, eos, **kw):
    llm = LLM(hf, overlap_scheduling=overlap, check_invariants=True, **kw)
    engine = llm.llm_engine
    engine.runner.model, engine.eos_token_id = _TokenRule(engine.runner.model), eos
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.manager.num_free_blocks == llm.manager.num_physical_blocks
    assert not llm.has_unfinished_requests() and getattr(llm.llm_engine.loop, 'launched', None) is None
    return [[(c.token_ids, c.finish_reason) for c in o.outputs] for o in outputs], llm


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_overlap_matches_the_synchronous_engine_on_many_random_runs(setup, data):
    """Many more random runs than the real model allows: a stand-in model, end-of-sequence and
    stop tokens it really draws, n > 1, preemption by recompute and by swap, prefix caching,
    chunked prefill, token budgets smaller than the batch."""
    hf, _, _ = setup
    prompts = data.draw(st.lists(st.lists(st.integers(0, 63), min_size=1, max_size=14),
                                 min_size=1, max_size=6))
    max_num_seqs = data.draw(st.sampled_from([2, 4, 16]))
    params = []
    for _ in prompts:
        sampled = data.draw(st.booleans())
        params.append(SamplingParams(
            temperature=0.8 if sampled else 0.0, seed=data.draw(st.integers(0, 9)),
            n=data.draw(st.integers(1, min(3, max_num_seqs))) if sampled else 1,
            max_tokens=data.draw(st.integers(1, 12)),
            stop_token_ids=data.draw(st.lists(st.integers(0, 63), max_size=2)),
            ignore_eos=data.draw(st.booleans())))
    kw = dict(block_size=data.draw(st.sampled_from([1, 2, 4])),
              num_blocks=data.draw(st.sampled_from([32, 40, 64, 256])),
              enable_prefix_caching=data.draw(st.booleans()),
              preemption_mode=data.draw(st.sampled_from(["recompute", "swap"])),
              max_num_seqs=max_num_seqs,
              enable_chunked_prefill=data.draw(st.booleans()),
              max_num_batched_tokens=data.draw(st.sampled_from([3, 8, 8192])))
    eos = data.draw(st.integers(0, 63))
    want, _ = _served_by_rule(hf, prompts, params, False, eos, **kw)
    got, llm = _served_by_rule(hf, prompts, params, True, eos, **kw)
    assert got == want


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), overlap=st.booleans())
def test_cancellations_at_random_steps_leave_nothing_behind(setup, data, overlap):
    """Requests cancelled at random steps, with or without a step in flight: every output holds
    true tokens only, the others still match a run without cancellations, every block is freed."""
    hf, _, _ = setup
    prompts = data.draw(st.lists(st.lists(st.integers(0, 63), min_size=1, max_size=10),
                                 min_size=2, max_size=6))
    params = SamplingParams(temperature=0.0, max_tokens=data.draw(st.integers(2, 10)),
                            ignore_eos=True)
    kw = dict(block_size=data.draw(st.sampled_from([1, 4])),
              num_blocks=data.draw(st.sampled_from([32, 64, 256])),  # every request fits; several preempt
              preemption_mode=data.draw(st.sampled_from(["recompute", "swap"])))
    want, _ = _served_by_rule(hf, prompts, params, overlap, None, **kw)
    llm = LLM(hf, overlap_scheduling=overlap, check_invariants=True, **kw)
    llm.llm_engine.runner.model = _TokenRule(llm.llm_engine.runner.model)
    ids = [llm.add_request(p, params) for p in prompts]
    cancel_at = data.draw(st.lists(st.integers(0, 12), max_size=3))
    outputs, step = {}, 0
    while llm.has_unfinished_requests():
        if step in cancel_at:
            live = [i for i in ids if i in llm.llm_engine.requests or any(o.request_id == i
                                                                 for o in llm.llm_engine.loop.ready)]
            if live:
                out = llm.abort_request(data.draw(st.sampled_from(live)))
                outputs[out.request_id] = out
        outputs.update((o.request_id, o) for o in llm.step())
        step += 1
    assert sorted(outputs) == ids and llm.manager.num_free_blocks == llm.manager.num_physical_blocks
    for k, i in enumerate(ids):
        got = outputs[i].outputs[0]
        assert UNRESOLVED not in got.token_ids
        assert got.token_ids == want[k][0][0][:len(got.token_ids)]   # a prefix of the full run
        if got.finish_reason != "abort":
            assert (got.token_ids, got.finish_reason) == want[k][0]
