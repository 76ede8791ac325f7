"""Checks for the chapter 15 exercises (exercises/ch15_prefill_and_overlap.py)."""

import pytest
import torch

from minipaged.kernels.prefill_attention import PrefillPlan  # before triton: the interpreter switch
from minipaged.model.qwen3 import ForwardBatch
from tests.exercises.answers import load, reference

ex = load("ch15_prefill_and_overlap")


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


# -- 14.2: states that expose wrong planners of the overlap ------------------------------------
#
# The learner gives, for each wrong planner below, a scheduler state on which it answers
# otherwise than the chapter's rule. The rule is written here, condition by condition; a grader
# self-test checks that it is what chapter 15's OverlapScheduler.next_is_decode decides.

FIELDS = ("running", "num_waiting", "num_swapped", "free_blocks", "max_num_seqs",
          "max_num_batched_tokens")


def plain_decode_next(running, num_waiting, num_swapped, free_blocks, max_num_seqs,
                      max_num_batched_tokens, *, wrong=None):
    """The chapter's rule: may the next step be planned before the last step's tokens are
    known? ``wrong`` names a planner of the exercise that gets one condition wrong."""
    if not running:
        return False
    if num_swapped and wrong != "ignores_swapped":
        return False                                     # a swap-in comes first
    if len(running) > max_num_batched_tokens and wrong != "ignores_budget":
        return False                                     # not every decode fits the step
    if wrong == "any_waiting_blocks":
        if num_waiting:
            return False
    elif num_waiting and len(running) < max_num_seqs and wrong != "ignores_waiting":
        return False                                     # a waiting request may be admitted
    if free_blocks < (1 if wrong == "one_free_block" else len(running)):
        return False                                     # a decode may find no block: preemption
    for prompt, outputs, computed in running:
        uncomputed = prompt + outputs - computed
        if wrong == "first_token_too":
            decoding = uncomputed == 1
        elif wrong == "outputs_mean_decoding":
            decoding = outputs > 0
        else:
            decoding = outputs > 0 and uncomputed == 1
        if not decoding:
            return False                                 # a prefill, or a first token to sample
    return True


WRONG_PLANNERS = ["ignores_swapped", "ignores_waiting", "any_waiting_blocks", "one_free_block",
                  "first_token_too", "outputs_mean_decoding", "ignores_budget"]


def valid_state(state):
    """Raise AssertionError unless ``state`` is a scheduler state the exercise allows."""
    assert isinstance(state, dict) and set(state) == set(FIELDS), \
        f"a state is a dict with exactly the keys {FIELDS}, not {state!r}"
    running = state["running"]
    for seq in running:
        assert len(seq) == 3 and all(isinstance(x, int) for x in seq), \
            f"a running sequence is (prompt tokens, output tokens, computed tokens), not {seq!r}"
        prompt, outputs, computed = seq
        assert prompt >= 1 and outputs >= 0, f"{seq}: a prompt of at least one token"
        assert 0 <= computed < prompt + outputs, \
            f"{seq}: a running sequence has 0 to prompt + outputs - 1 computed tokens"
    for name in FIELDS[1:]:
        assert isinstance(state[name], int) and state[name] >= 0, f"{name} = {state[name]!r}"
    assert state["max_num_seqs"] >= 1 and state["max_num_batched_tokens"] >= 1
    assert len(running) <= state["max_num_seqs"], "more sequences run than max_num_seqs allows"


def exposes(wrong, state):
    """Raise AssertionError unless ``state`` is valid and the planner ``wrong`` answers on it
    otherwise than the rule."""
    valid_state(state)
    state = {**state, "running": [tuple(s) for s in state["running"]]}
    right, got = plain_decode_next(**state), plain_decode_next(**state, wrong=wrong)
    assert right != got, (f"{wrong} answers {got} on this state, as the rule does: it exposes "
                          f"nothing ({state})")


@pytest.mark.parametrize("wrong", WRONG_PLANNERS)
def test_14_2_a_state_exposes_the_wrong_planner(wrong):
    states = ex.exposing_states()
    assert wrong in states, f"give a state for each of {WRONG_PLANNERS}"
    exposes(wrong, states[wrong])


@pytest.mark.grader
@pytest.mark.parametrize("wrong", WRONG_PLANNERS)
def test_14_2_the_grader_passes_the_reference(wrong):
    exposes(wrong, reference("ch15_prefill_and_overlap").exposing_states()[wrong])


OK = dict(running=[(10, 3, 12), (5, 1, 5), (40, 7, 46)], num_waiting=0, num_swapped=0,
          free_blocks=8, max_num_seqs=8, max_num_batched_tokens=64)


@pytest.mark.grader
@pytest.mark.parametrize("wrong,state", [
    ("one_free_block", {**OK, "running": [(10, 3, 12)], "free_blocks": 0}),  # one sequence
    ("any_waiting_blocks", {**OK, "num_waiting": 1}),       # a free seat: both refuse
    ("ignores_waiting", {**OK, "num_waiting": 2, "max_num_seqs": 3}),   # no free seat
    ("first_token_too", {**OK, "running": [(8, 0, 5)]}),    # still prefilling: both refuse
    ("outputs_mean_decoding", {**OK, "running": [(30, 0, 16)]}),    # no output yet
    ("ignores_budget", {**OK, "max_num_batched_tokens": 3}),         # all three fit
    ("ignores_swapped", {**OK, "num_swapped": 1, "free_blocks": 0}),  # refused anyway
    ("ignores_budget", OK),                                  # the rule plans it: so does the bug
])
def test_14_2_the_grader_rejects_states_that_expose_nothing(wrong, state):
    with pytest.raises(AssertionError):
        exposes(wrong, state)


@pytest.mark.grader
@pytest.mark.parametrize("state", [
    {**OK, "running": [(10, 3, 13)]},                        # nothing left to compute
    {**OK, "max_num_seqs": 2},                               # three run, two allowed
    {**OK, "num_waiting": -1},
    {**OK, "running": [(0, 1, 0)]},                          # no prompt
    {k: v for k, v in OK.items() if k != "num_swapped"},
])
def test_14_2_the_grader_rejects_impossible_states(state):
    with pytest.raises(AssertionError):
        valid_state(state)


def next_is_decode_of(state):
    """Chapter 15's ``OverlapScheduler.next_is_decode`` in ``state``."""
    from collections import deque
    from types import SimpleNamespace

    from minipaged.engine.overlap_scheduler import OverlapScheduler
    from minipaged.engine.scheduler import SchedulerConfig

    usage = SimpleNamespace(block_size=4, num_blocks=1024, num_free_blocks=state["free_blocks"])
    scheduler = OverlapScheduler(SimpleNamespace(usage=lambda: usage), SchedulerConfig(
        max_num_seqs=state["max_num_seqs"],
        max_num_batched_tokens=state["max_num_batched_tokens"]))
    scheduler.running = [SimpleNamespace(prompt_token_ids=[0] * p, output_token_ids=[1] * o,
                                         num_computed_tokens=c) for p, o, c in state["running"]]
    scheduler.waiting = deque([None] * state["num_waiting"])
    scheduler.swapped = deque([None] * state["num_swapped"])
    return scheduler.next_is_decode()


@pytest.mark.grader
def test_14_2_the_graders_rule_is_the_chapters():
    """The rule the states are judged by decides as chapter 15's scheduler does, on the
    reference's states, the grader's own, and states drawn at random."""
    import random

    rng = random.Random(0)
    states = [OK, *reference("ch15_prefill_and_overlap").exposing_states().values()]
    for _ in range(400):   # mostly decoding sequences, one or two fields in the way
        running = []
        for _ in range(rng.randint(0, 4)):
            prompt, outputs = rng.randint(1, 9), rng.choice([0, 1, 1, 3, 3])
            left = min(prompt + outputs, rng.choice([1, 1, 1, 1, 2, prompt + outputs]))  # to compute
            running.append((prompt, outputs, prompt + outputs - left))
        states.append(dict(running=running, num_waiting=rng.choice([0, 0, 2]),
                           num_swapped=rng.choice([0, 0, 0, 1]), free_blocks=rng.randint(0, 6),
                           max_num_seqs=max(1, len(running) + rng.choice([0, 0, 1, 3])),
                           max_num_batched_tokens=rng.randint(1, 8)))
    for state in states:
        valid_state(state)
    decisions = [plain_decode_next(**s) for s in states]
    assert 0.1 < sum(decisions) / len(decisions) < 0.9, sum(decisions)   # both answers tried
    for state, decision in zip(states, decisions):
        assert next_is_decode_of(state) == decision, state


@pytest.mark.grader
def test_14_1_the_plan_agrees_with_the_kernel_input():
    """The definition the exercise is graded by is the kernel's: the same tiles as the plan
    chapter 15's kernel launches over (for batches whose sequences all have new tokens)."""
    for query_lens, block_m in CASES:
        if query_lens and min(query_lens) > 0:
            assert expected_tiles(query_lens, block_m) == kernel_plan_tiles(query_lens, block_m)
    assert torch.tensor([s for s, _ in expected_tiles([5, 17, 1, 33], 16)]).bincount().tolist() \
        == [1, 2, 1, 3]


@pytest.mark.grader
def test_14_2_the_chapters_example_exposes_its_planner():
    """The example state the exercise shows exposes the planner it is given for."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "chapters"
            / "15_prefill_and_overlap.md").read_text()
    exercise = text[text.index(":::{exercise} 15.2"):]
    source = exercise[exercise.index("```python\n") + 10:]
    (name, state), = eval("{" + source[:source.index("```")] + "}", {"dict": dict}).items()
    assert name == "ignores_swapped"
    exposes(name, state)
