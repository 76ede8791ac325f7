"""One caller at a time: a second thread, or a call from inside a step, is refused at once with
EngineBusyError, and the engine stays healthy (no leaked block, consistent manager)."""

import threading

import pytest

import minipaged.entrypoints.llm
from minipaged.engine.llm_engine import EngineBusyError, LLMEngine
from tests.test_engine import GREEDY, setup  # noqa: F401  (the tiny model, prompts, greedy reference)

ENGINES = pytest.mark.parametrize("make", [LLMEngine, minipaged.entrypoints.llm.LLM],
                                  ids=["chapter 12", "minipaged.LLM"])


def engine_of(llm):
    return getattr(llm, "llm_engine", llm)


def healthy(llm, prompts, reference):
    engine = engine_of(llm)
    assert not llm.has_unfinished_requests()
    assert engine.manager.num_free_blocks == engine.manager.num_physical_blocks
    assert engine.manager.first_inconsistency() is None
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    assert got == reference


@ENGINES
def test_a_call_from_inside_a_step_is_refused(setup, make):
    hf, prompts, reference = setup
    llm = make(hf, block_size=4, check_invariants=True)
    inner = []

    def reenter(module, args):
        for call in (lambda: llm.generate([prompts[0]], GREEDY, use_tqdm=False),
                     lambda: llm.add_request(prompts[0], GREEDY),
                     lambda: llm.step()):
            with pytest.raises(EngineBusyError, match="inside a step"):
                call()
            inner.append(1)

    hook = engine_of(llm).model.register_forward_pre_hook(reenter)
    outputs = llm.generate(prompts[:2], GREEDY, use_tqdm=False)
    hook.remove()
    assert inner and [o.outputs[0].token_ids for o in outputs] == reference[:2]
    healthy(llm, prompts[:3], reference[:3])


@ENGINES
def test_a_second_thread_is_refused_while_a_call_runs(setup, make):
    hf, prompts, reference = setup
    llm = make(hf, block_size=4, check_invariants=True)
    in_step, release, refused = threading.Event(), threading.Event(), []
    hook = engine_of(llm).model.register_forward_pre_hook(
        lambda module, args: (in_step.set(), release.wait(10)) and None)
    worker = threading.Thread(target=lambda: llm.generate(prompts[:2], GREEDY, use_tqdm=False))
    worker.start()
    assert in_step.wait(10)
    for call in (lambda: llm.add_request(prompts[2], GREEDY), lambda: llm.step(),
                 lambda: llm.abort_request(0),
                 lambda: llm.generate([prompts[2]], GREEDY, use_tqdm=False)):
        with pytest.raises(EngineBusyError, match="another thread"):
            call()
        refused.append(1)
    release.set()
    worker.join(30)
    hook.remove()
    assert not worker.is_alive() and len(refused) == 4
    healthy(llm, prompts[:3], reference[:3])


def test_two_threads_stepping_one_engine_never_leak_blocks(setup):
    """Two threads each add and step as fast as they can: every call either runs whole or is
    refused, and the blocks all come back."""
    hf, prompts, _ = setup
    llm = LLMEngine(hf, block_size=2, num_blocks=64, check_invariants=True)
    busy, errors = [], []

    def drive(k):
        for i in range(20):
            try:
                llm.add_request(prompts[(k + i) % len(prompts)], GREEDY)
                llm.step()
            except EngineBusyError:
                busy.append(1)
            except Exception as error:  # anything else is a bug
                errors.append(error)

    threads = [threading.Thread(target=drive, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    while llm.has_unfinished_requests():
        llm.step()
    assert llm.manager.num_free_blocks == llm.manager.num_physical_blocks
    assert llm.manager.first_inconsistency() is None
