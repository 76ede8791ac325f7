"""Checks for the chapter 12 exercises (exercises/ch12_engine.py)."""

import random

import pytest
import torch

from functools import partial

from minipaged.engine.llm_engine import EngineParts, LLMEngine
from minipaged.engine.sampler import Sampler
from minipaged.model.qwen3 import random_qwen3, tiny_qwen3_config
from minipaged.engine.scheduler import SamplingParams
from tests.exercises.answers import load

ex = load("ch12_engine")


# -- 12.1: a repetition penalty, graded against transformers ---------------------------------

NEW = 8


def _reference_penalty(logits, histories, penalty):
    """transformers' RepetitionPenaltyLogitsProcessor, row by row (the ground truth)."""
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    process = RepetitionPenaltyLogitsProcessor(penalty)
    rows = [process(torch.tensor([h or [0]]), logits[i:i + 1].clone()) if h
            else logits[i:i + 1].clone() for i, h in enumerate(histories)]
    return torch.cat(rows)


def grade_penalty_function(fn):
    """Raise AssertionError unless ``fn`` is a correct ``apply_repetition_penalty``."""
    torch.manual_seed(0)
    logits = torch.randn(4, 40) * 3
    logits[0, 5] = 0.0
    histories = [[5, 3, 3, 3, 7], [], [39, 0, 12, 12], [1, 2, 3, 4, 5, 6, 7, 8]]
    before = logits.clone()
    for penalty in (1.0, 1.3, 2.5, 0.8):
        got = fn(logits, histories, penalty)
        assert torch.equal(logits, before), "the input logits must not change"
        want = _reference_penalty(logits, histories, penalty)
        assert got.shape == want.shape
        assert torch.allclose(got, want, atol=1e-6), f"penalty {penalty}: wrong logits"


@pytest.fixture(scope="module")
def penalty_setup():
    hf = random_qwen3(tiny_qwen3_config(), seed=0, dtype=torch.float32)
    rng = random.Random(0)
    prompts = [[rng.randrange(512) for _ in range(n)] for n in (5, 17, 33, 9, 2)]
    # prompts 0 and 4 repeat tokens in their outputs; the last two hold in their prompts
    # tokens the model would pick next
    prompts = [prompts[0], prompts[4], prompts[4] + [54], prompts[0] + [240, 45]]
    greedy = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)
    plain = [o.outputs[0].token_ids
             for o in LLMEngine(hf, block_size=4).generate(prompts, greedy, use_tqdm=False)]
    want = {penalty: _hf_penalised(hf, prompts, penalty) for penalty in (1.5,)}
    assert all(w != plain for w in want.values())   # the penalty must matter here
    return hf, prompts, plain, want


def _hf_penalised(hf, prompts, penalty):
    out = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        seq = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                          max_new_tokens=NEW, min_new_tokens=NEW, pad_token_id=0,
                          repetition_penalty=penalty)
        out.append(seq[0, len(prompt):].tolist())
    return out


def engine_with(sampler, hf, penalty=None, **options) -> LLMEngine:
    """Chapter 11's engine with ``sampler`` as its sampling part."""
    part = sampler if penalty is None else partial(sampler, repetition_penalty=penalty)
    return LLMEngine(hf, parts=EngineParts(sampler=part), **options)


def grade_penalized_sampler(sampler, setup):
    """Raise AssertionError unless an engine with ``sampler`` serves greedy requests like
    transformers does."""
    hf, prompts, plain, want = setup
    greedy = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)
    default = engine_with(sampler, hf, block_size=4).generate(prompts, greedy, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in default] == plain, "penalty 1.0 changed tokens"
    for penalty, expected in want.items():
        llm = engine_with(sampler, hf, penalty, block_size=4, max_num_seqs=2)
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)]
        assert got == expected, f"penalty {penalty}: {got} != {expected}"
        assert llm.manager.num_free_blocks == llm.manager.num_physical_blocks


def test_12_1_penalty_function():
    grade_penalty_function(ex.apply_repetition_penalty)


def test_12_1_penalized_sampler_equals_transformers(penalty_setup):
    grade_penalized_sampler(ex.PenalizedSampler, penalty_setup)


# Planted bugs: the graders above must reject each of them.

def _divides_always(logits, histories, penalty):
    out = logits.clone()
    for row, h in enumerate(histories):
        ids = torch.tensor(sorted(set(h)), dtype=torch.long)
        if len(ids):
            out[row, ids] = out[row, ids] / penalty
    return out


def _counts_repeats(logits, histories, penalty):
    out = logits.clone()
    for row, h in enumerate(histories):
        for t in h:
            x = out[row, t]
            out[row, t] = x / penalty if x > 0 else x * penalty
    return out


def _shares_history(logits, histories, penalty):
    seen = sorted({t for h in histories for t in h})
    return _reference_penalty(logits, [seen] * len(histories), penalty)


def _in_place(logits, histories, penalty):
    logits.copy_(_reference_penalty(logits, histories, penalty))
    return logits


@pytest.mark.parametrize("bug", [_divides_always, _counts_repeats, _shares_history, _in_place])
def test_12_1_planted_bugs_fail_where_your_function_passes(bug):
    grade_penalty_function(ex.apply_repetition_penalty)
    with pytest.raises(AssertionError):
        grade_penalty_function(bug)


def _planted_sampler(history):
    class Planted(Sampler):
        def __init__(self, device, repetition_penalty=1.0):
            super().__init__(device)
            self.repetition_penalty = repetition_penalty

        def __call__(self, logits, seqs):
            if seqs:
                logits = _reference_penalty(logits, [history(s) for s in seqs],
                                            self.repetition_penalty)
            return super().__call__(logits, seqs)

    return Planted


@pytest.mark.parametrize("history", [lambda s: list(s.output_token_ids),
                                     lambda s: list(s.prompt_token_ids)],
                         ids=["output-only", "prompt-only"])
def test_12_1_planted_engine_bugs_fail_where_your_engine_passes(penalty_setup, history):
    ex.PenalizedSampler("cpu", repetition_penalty=1.5)  # yours exists
    with pytest.raises(AssertionError):
        grade_penalized_sampler(_planted_sampler(history), penalty_setup)
