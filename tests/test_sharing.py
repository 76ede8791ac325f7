"""Focused unit tests of minipaged.memory.sharing (chapter 5): fork, copy-on-write, swapping, debugging aids."""

import copy

import pytest

from minipaged.memory.block_manager import (NoFreeBlocksError, SequenceExistsError,
                                            StepPendingError, UnknownSequenceError)
from minipaged.book.fragmentation import TraceRequest
from minipaged.memory.sharing import SharingBlockManager, beam_search_savings, parallel_sampling_savings


def full_state(m):
    return ({s: (m.block_table(s), m.sequence_length(s)) for s in m.seq_ids()}, list(m._free),
            [m.refcount(b) for b in range(m.num_physical_blocks)], list(m._cpu_free),
            {s: list(m._swapped[s].block_table) for s in m.swapped_ids()})


def make(num_blocks=16, bs=4, cpu=0, **seqs):
    m = SharingBlockManager(num_blocks, bs, num_cpu_blocks=cpu)
    for s, n in seqs.items():
        m.create_sequence(s)
        m.append_tokens(s, n)
    return m


def test_fork_shares_and_validates():
    m = make(a=5)
    m.fork("a", "b")
    assert m.block_table("b") == m.block_table("a") and m.sequence_length("b") == 5
    assert all(m.refcount(b) == 2 for b in m.block_table("a"))
    with pytest.raises(SequenceExistsError):
        m.fork("a", "b")
    with pytest.raises(UnknownSequenceError):
        m.fork("zzz", "c")
    step = m.reserve_step(["a"])
    with pytest.raises(StepPendingError):
        m.fork("a", "c")
    m.abort_step(step)
    assert m.invariants_ok()


def test_copy_on_write_only_for_shared_partial_blocks():
    m = make(bs=4, a=8)
    m.fork("a", "b")
    step = m.reserve_step(["a", "b"])           # position 8: both start fresh blocks, no copy
    assert step.copies == [] and m.num_blocks_to_allocate({"a": 1}) == 0
    m.commit_step(step)
    assert m.block_table("a")[:2] == m.block_table("b")[:2]
    m.fork("a", "c")                            # a and c share a partial block now
    assert m.num_blocks_to_allocate({"c": 1}) == 1 and m.num_blocks_to_allocate({"c": 3}) == 1
    assert m.num_blocks_to_allocate({"c": 4}) == 2 and m.num_blocks_to_allocate({"c": 0}) == 0
    step = m.reserve_step({"c": 2, "a": 1})
    (src, dst), = step.copies
    assert src == m.block_table("a")[2] and dst == m.block_table("c")[2]
    assert step.slot_mapping.tolist()[:2] == [dst * 4 + 1, dst * 4 + 2]
    assert step.slot_mapping.tolist()[2] == src * 4 + 1   # a: the last sharer writes in place
    m.commit_step(step)
    assert m.invariants_ok()


def test_a_step_carries_the_tables_after_copy_on_write():
    m = make(a=5)
    m.fork("a", "b")
    step = m.reserve_step(["a", "b"])  # both write into the shared partial block: one copies
    assert step.copies
    for row, seq in enumerate(step.seq_ids):
        assert step.block_tables[row].tolist() == m.block_table(seq)


def test_three_sharers_one_step_recount():
    """The last sharer of a partial block needs no copy even though the up-front count assumed one."""
    m = make(bs=4, a=2)
    m.fork("a", "b")
    m.fork("a", "c")
    assert m.num_blocks_to_allocate({"a": 1, "b": 1, "c": 1}) == 3
    free = m.num_free_blocks
    step = m.reserve_step(["a", "b", "c"])
    assert len(step.copies) == 2 and m.num_free_blocks == free - 2
    m.commit_step(step)
    assert m.invariants_ok()


def test_failure_mid_step_with_copy_on_write_leaves_state_unchanged(monkeypatch, fail_on_take):
    m = make(bs=4, a=6, x=3)
    m.fork("a", "b")
    before = full_state(m)
    fail_on_take(m, 3)
    with pytest.raises(RuntimeError, match="injected"):
        m.reserve_step({"b": 7, "x": 2, "a": 1})   # b: copy + new blocks, then x fails
    assert full_state(m) == before and m.invariants_ok() and m.pending_step is None
    monkeypatch.undo()
    step = m.reserve_step({"b": 7, "x": 2, "a": 1})
    m.abort_step(step)
    assert full_state(m) == before


def test_no_free_blocks_with_copy_on_write_changes_nothing():
    m = make(num_blocks=3, bs=4, a=6)
    m.fork("a", "b")
    before = full_state(m)
    with pytest.raises(NoFreeBlocksError):
        m.reserve_step({"a": 1, "b": 3})        # a copies (1) + b copies and grows (2) > 1 free
    assert full_state(m) == before


def test_swap_out_and_in():
    m = make(num_blocks=6, bs=4, cpu=3, a=9, b=2)
    with pytest.raises(UnknownSequenceError):
        m.swap_out("zz")
    with pytest.raises(ValueError):
        SharingBlockManager(4, 4, num_cpu_blocks=-1)
    a_table = m.block_table("a")
    pairs = m.swap_out("a")
    assert [g for g, _ in pairs] == a_table and len({c for _, c in pairs}) == 3
    assert "a" not in m and m.is_swapped("a") and m.num_free_cpu_blocks == 0
    with pytest.raises(UnknownSequenceError, match="swapped out"):
        m.append_token("a")
    with pytest.raises(SequenceExistsError):
        m.create_sequence("a")
    before = full_state(m)
    with pytest.raises(NoFreeBlocksError, match="CPU pool"):
        m.swap_out("b")
    assert full_state(m) == before
    m.append_tokens("b", 14)                     # b takes 4 blocks: 1 GPU block left
    before = full_state(m)
    with pytest.raises(NoFreeBlocksError):
        m.swap_in("a")
    assert full_state(m) == before
    m.release_sequence("b")
    back = m.swap_in("a")
    assert [c for c, _ in back] == [c for _, c in pairs] and m.sequence_length("a") == 9
    assert m.num_free_cpu_blocks == 3 and m.invariants_ok()
    with pytest.raises(UnknownSequenceError, match="not swapped"):
        m.swap_in("a")


def test_swap_out_of_a_shared_sequence_keeps_the_others_blocks():
    m = make(num_blocks=8, bs=4, cpu=4, a=6)
    m.fork("a", "b")
    pairs = m.swap_out("b")
    assert len(pairs) == 2 and all(m.refcount(g) == 1 for g, _ in pairs)
    m.release_swapped("b")
    assert m.num_free_cpu_blocks == 4 and m.invariants_ok()
    with pytest.raises(UnknownSequenceError):
        m.release_swapped("b")


def test_event_log_and_history():
    m = make(bs=4, a=6)
    m.fork("a", "b")
    m.append_token("b")
    m.release_sequence("a")
    ops = [e.op for e in m.history("b")]
    assert ops == ["ref", "ref", "alloc", "cow"]
    assert m.history("a")[-1].op == "unref" and m.history("a")[-1].refcount == 1
    quiet = SharingBlockManager(4, 4, event_log_size=0)
    quiet.create_sequence(0)
    quiet.append_tokens(0, 5)
    assert not quiet.events


def test_reconciliation_names_the_first_bad_block():
    m = make(bs=4, a=6)
    m.fork("a", "b")
    first = m.block_table("a")[0]
    bad = copy.deepcopy(m)
    bad._refcount[first] = 3
    assert bad.first_inconsistency() == f"block {first}: refcount 3 but 2 table(s) hold it ['a', 'b']"
    bad = copy.deepcopy(m)
    bad._refcount[15] = 1
    assert "refcount 1 but 0" in bad.first_inconsistency()
    bad = copy.deepcopy(m)
    bad._free.pop()
    assert "leaked" in bad.first_inconsistency()
    bad = copy.deepcopy(make(bs=4, cpu=2, a=3))
    bad._cpu_free.pop()
    assert bad.first_inconsistency().startswith("CPU block")


def test_internal_fragmentation_counts_shared_blocks_once():
    m = make(bs=4, a=6)
    assert m.internal_fragmentation_tokens() == 2
    m.fork("a", "b")
    assert m.internal_fragmentation_tokens() == 2
    m.append_token("b")
    assert m.internal_fragmentation_tokens() == 2 + 1


def test_savings_simulations():
    reqs = [TraceRequest(0.0, 40, 30), TraceRequest(0.0, 10, 50)]
    p2, p4 = parallel_sampling_savings(reqs, 2), parallel_sampling_savings(reqs, 4)
    assert 0 < p2 < p4 < 0.5
    assert parallel_sampling_savings(reqs, 1) == 0.0
    b4 = beam_search_savings(reqs, 4, seed=1)
    assert b4 > p4
    assert beam_search_savings(reqs, 4, seed=1) == b4        # reproducible


def test_batch_block_count_matches_one_by_one():
    """The step-wide NumPy count equals chapter 5's count per sequence, shared partial blocks included."""
    import random

    rng = random.Random(3)
    bs = 4
    m = SharingBlockManager(4000, bs)
    for s in range(60):
        m.create_sequence(s)
        m.append_tokens(s, rng.randint(0, 30))
    for s in range(0, 60, 4):
        m.fork(s, 100 + s)  # shared blocks, some of them partly filled
    m.fork(100, 200)
    states = [m._seqs[s] for s in m.seq_ids()]
    assert len(states) >= m._BATCH_COUNT_MIN
    cow_seen = False
    for _ in range(30):
        counts = [rng.choice([0, 1, 1, 2, 3, 4, 5, 9]) for _ in states]
        batch = m._new_blocks_for_step(states, counts)
        one_by_one = [m._new_blocks_for(st, n) for st, n in zip(states, counts)]
        assert batch == one_by_one
        cow_seen |= any(n and st.length % bs and m.refcount(st.block_table[st.length // bs]) > 1
                        for st, n in zip(states, counts))
    assert cow_seen
    step = m.reserve_step({s: 1 for s in m.seq_ids()})  # the whole path: copies made, invariants hold
    assert step.copies and m.invariants_ok()
    m.abort_step(step)
    assert m.invariants_ok()
