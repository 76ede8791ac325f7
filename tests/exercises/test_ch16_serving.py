"""Checks for the chapter 16 exercises (exercises/ch16_serving.py)."""

import pytest
import torch

from minipaged.engine.llm_engine import LLMEngine
from minipaged.model.qwen3 import random_qwen3, tiny_qwen3_config
from minipaged.engine.scheduler import SamplingParams
from tests.exercises.answers import load, reference

ex = load("ch16_serving")
PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def model():
    return random_qwen3(tiny_qwen3_config(), seed=0, dtype=torch.float32)


def grade_abort(model, abort_disconnected):
    """Four requests run two steps; the clients of two (and of one that never existed) leave."""
    engine = LLMEngine(model, block_size=2, num_blocks=64, check_invariants=True)
    live = {f"r{i}": engine.add_request([3 + i] * (3 + 2 * i), PARAMS) for i in range(4)}
    engine.step(), engine.step()
    gone = {"r1", "r3", "finished-long-ago"}
    aborted_ids = [live["r1"], live["r3"]]
    assert abort_disconnected(engine, live, gone) == 2, "must return how many were aborted"
    assert sorted(live) == ["r0", "r2"], "the aborted requests must leave `live`"
    owners = engine.manager.block_owners()
    held = {b for b, seqs in owners.items() if seqs}
    assert engine.manager.num_free_blocks == engine.manager.num_physical_blocks - len(held)
    assert all(i not in engine.requests for i in aborted_ids), \
        "an aborted request is still in the engine: its blocks are not freed (a leak)"
    assert abort_disconnected(engine, live, gone) == 0, "a second call must abort nothing"
    finished = []
    for _ in range(20):
        if not engine.has_unfinished_requests():
            break
        finished += engine.step()
    assert sorted(o.request_id for o in finished) == sorted(live.values())
    assert engine.manager.num_free_blocks == engine.manager.num_physical_blocks
    assert engine.manager.first_inconsistency() is None


def test_15_1_abort_disconnected(model):
    grade_abort(model, ex.abort_disconnected)


def forgets_only(engine, live, gone):  # the server forgets the request; the engine keeps it
    return sum(live.pop(r, None) is not None for r in gone)


def keeps_live(engine, live, gone):  # aborts, but the next call aborts the same ids again
    targets = [live[r] for r in gone if r in live]
    for engine_id in targets:
        engine.abort_request(engine_id)
    return len(targets)


def stops_at_unknown(engine, live, gone):  # an id that already finished raises
    for r in sorted(gone):
        engine.abort_request(live.pop(r))
    return len(gone)


@pytest.mark.grader
def test_15_1_a_correct_answer_passes_the_grading(model):
    grade_abort(model, reference("ch16_serving").abort_disconnected)


@pytest.mark.grader
@pytest.mark.parametrize("buggy", [forgets_only, keeps_live, stops_at_unknown])
def test_15_1_grading_catches_planted_bugs(model, buggy):
    with pytest.raises((AssertionError, KeyError)):
        grade_abort(model, buggy)
