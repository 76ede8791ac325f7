"""Checks for the chapter 14 exercises (exercises/ch14_prefill_and_overlap.py)."""

import pytest
import torch

from minipaged.kernels.prefill_attention import PrefillPlan  # before triton: the interpreter switch
from minipaged.model.qwen3 import ForwardBatch
from tests.exercises.answers import load

ex = load("ch14_prefill_and_overlap")


# -- 14.1: query tiles of a prefill batch, graded with planted bugs -----------------------------

CASES = [([5, 17, 1, 33], 16), ([16, 32], 16), ([0, 3, 0, 7], 4), ([1] * 5, 8), ([9], 1), ([], 4)]


def expected_tiles(query_lens, block_m):
    """The tiles by definition: each sequence's new tokens cut every ``block_m`` from 0, the
    last tile partial, none for a sequence with no new tokens; numbered within the sequence."""
    return [(seq, start) for seq, q_len in enumerate(query_lens)
            for start in range(0, q_len, block_m)]


def kernel_plan_tiles(query_lens, block_m):
    """The tiles the paged prefill kernel's plan lists, as (sequence, first new token)."""
    batch = ForwardBatch.from_sequences([[0] * q for q in query_lens], [0] * len(query_lens),
                                        [[0] * q for q in query_lens], 1, "cpu")
    plan = PrefillPlan.for_batch(batch, block_m)
    return list(zip(plan.tile_seq.tolist(), plan.tile_start.tolist()))


def grade_query_tiles(fn, cases=CASES):
    for query_lens, block_m in cases:
        want = expected_tiles(query_lens, block_m)
        got = [tuple(t) for t in fn(list(query_lens), block_m)]
        assert got == want, (query_lens, block_m, got, want)


def planted(bug):
    def fn(query_lens, block_m):
        tiles = []
        for seq, q_len in enumerate(query_lens):
            count = q_len // block_m if bug == 1 else -(-q_len // block_m)  # 1: no partial tile
            if bug == 2:
                count = max(1, count)                                       # 2: a tile for nothing
            for t in range(count):
                tiles.append((seq, (len(tiles) if bug == 3 else t) * block_m))  # 3: global numbering
        return tiles
    return fn


def test_14_1_query_tiles():
    grade_query_tiles(ex.query_tiles)


@pytest.mark.grader
def test_14_1_the_grader_passes_a_correct_answer():
    grade_query_tiles(planted(0))


@pytest.mark.grader
@pytest.mark.parametrize("bug", [1, 2, 3])
def test_14_1_the_grader_rejects_planted_bugs(bug):
    with pytest.raises(AssertionError):
        grade_query_tiles(planted(bug))


@pytest.mark.grader
def test_14_1_multiples_of_the_tile_hide_the_missing_partial_tile():
    grade_query_tiles(planted(1), cases=[([16, 32], 16), ([8, 8], 4)])  # why the cases are ragged


# -- 14.2: which steps may be planned before the previous step's tokens are known ---------------

def grade_plannable(fn):
    decoding = [(10, 3, 12), (5, 1, 5), (40, 7, 46)]
    ok = dict(num_waiting=0, num_swapped=0, free_blocks=8, max_num_seqs=8,
              max_num_batched_tokens=64)
    assert fn(decoding, **ok)
    assert not fn([], **ok), "no running sequence: nothing to plan"
    assert not fn(decoding, **{**ok, "num_waiting": 1}), "a waiting request fits"
    assert fn(decoding, **{**ok, "num_waiting": 5, "max_num_seqs": 3}), \
        "waiting requests cannot be admitted while max_num_seqs run"
    assert not fn(decoding, **{**ok, "num_swapped": 1}), "a swap-in comes first"
    assert not fn(decoding, **{**ok, "free_blocks": 2}), "a preemption may follow"
    assert fn(decoding, **{**ok, "free_blocks": 3}), "one new block each at most"
    assert not fn(decoding, **{**ok, "max_num_batched_tokens": 2}), "over the budget"
    assert not fn(decoding + [(30, 0, 16)], **ok), "a prompt still being prefilled"
    assert not fn(decoding + [(8, 0, 7)], **ok), "a first token (forks, TTFT) is due"


def test_14_2_plannable():
    grade_plannable(ex.plannable)


def planted_plannable(bug):
    reference = load_reference().plannable

    def fn(running, num_waiting, num_swapped, free_blocks, max_num_seqs, max_num_batched_tokens):
        if bug == 1:
            num_waiting = 0                          # 1: ignores the waiting queue
        if bug == 2:
            free_blocks = 10**9                      # 2: ignores a preemption to come
        if bug == 3:                                 # 3: a first token is not special
            running = [(p, max(o, 1), c + (o == 0)) for p, o, c in running]
        return reference(running, num_waiting, num_swapped, free_blocks, max_num_seqs,
                         max_num_batched_tokens)
    return fn


def load_reference():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "solutions" / "ch14_prefill_and_overlap.py"
    spec = importlib.util.spec_from_file_location("reference_ch14_prefill_and_overlap", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.grader
def test_14_2_the_grader_passes_the_reference():
    grade_plannable(load_reference().plannable)


@pytest.mark.grader
@pytest.mark.parametrize("bug", [1, 2, 3])
def test_14_2_the_grader_rejects_planted_bugs(bug):
    with pytest.raises(AssertionError):
        grade_plannable(planted_plannable(bug))


@pytest.mark.grader
def test_14_1_the_plan_agrees_with_the_kernel_input():
    """The definition the exercise is graded by is the kernel's: the same tiles as the plan
    chapter 14's kernel launches over (for batches whose sequences all have new tokens)."""
    for query_lens, block_m in CASES:
        if query_lens and min(query_lens) > 0:
            assert expected_tiles(query_lens, block_m) == kernel_plan_tiles(query_lens, block_m)
    assert torch.tensor([s for s, _ in expected_tiles([5, 17, 1, 33], 16)]).bincount().tolist() \
        == [1, 2, 1, 3]
