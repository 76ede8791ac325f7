"""Focused unit tests of minipaged.memory.block_manager (chapter 4)."""

import copy

import numpy as np
import pytest
import torch

from minipaged.memory.block_manager import (BlockManagerError, DoubleReleaseError, KVBlockManager,
                                            NoFreeBlocksError, SequenceExistsError,
                                            StepPendingError, TeachingBlockManager,
                                            UnknownSequenceError, compute_slot_mapping)


def state_of(m):
    return ({s: (m.block_table(s), m.sequence_length(s)) for s in m.seq_ids()},
            list(m._free), m.num_free_blocks)


@pytest.mark.parametrize("args", [(0, 16), (8, 0), (-1, 4), (8, -2), (8.0, 16), (8, True), ("8", 4)])
def test_bad_sizes_are_value_errors(args):
    with pytest.raises(ValueError, match="positive integer"):
        KVBlockManager(*args)


def test_seed_examples_slot_mapping():
    assert compute_slot_mapping([[7, 1]] * 4, [0] * 4, [0, 3, 4, 6], [1] * 4, 4).tolist() == [28, 31, 4, 6]
    assert compute_slot_mapping([[5, 2, 9, 1]], [0], [6], [1], 4).tolist() == [10]
    empty = compute_slot_mapping([], [], [], [], 4)
    assert empty.dtype == np.int64 and empty.size == 0


def test_slot_mapping_matches_scalar_formula_random():
    rng = np.random.default_rng(1)
    bs = 8
    tables = [list(rng.permutation(200)[:20]) for _ in range(30)]
    starts = rng.integers(0, 100, 30)
    counts = rng.integers(0, 50, 30)
    firsts = starts // bs
    slices = [t[f:(s + n + bs - 1) // bs] for t, f, s, n in zip(tables, firsts, starts, counts)]
    got = compute_slot_mapping(slices, firsts, starts, counts, bs).tolist()
    want = [t[p // bs] * bs + p % bs for t, s, n in zip(tables, starts, counts) for p in range(s, s + n)]
    assert got == want


def test_append_matches_formula_and_block_boundaries():
    for bs in (1, 2, 3, 16):
        m = KVBlockManager(64, bs)
        m.create_sequence(0)
        for t in range(1, 40):
            slot = m.append_token(0)
            table = m.block_table(0)
            assert slot == table[(t - 1) // bs] * bs + (t - 1) % bs
            assert len(table) == -(-t // bs)
            assert m.internal_fragmentation_tokens() == len(table) * bs - t
        assert m.invariants_ok()


def test_interleaved_sentinels_never_overlap():
    m = KVBlockManager(40, 2)
    cache = {}
    rng = np.random.default_rng(0)
    lengths = {s: 0 for s in range(5)}
    for s in lengths:
        m.create_sequence(s)
    for _ in range(70):
        s = int(rng.integers(5))
        slot = m.append_token(s)
        assert slot not in cache
        cache[slot] = (s, lengths[s])
        lengths[s] += 1
    for s, n in lengths.items():
        table = m.block_table(s)
        assert [cache[table[t // 2] * 2 + t % 2] for t in range(n)] == [(s, t) for t in range(n)]


def test_errors_are_typed_and_leave_state():
    m = KVBlockManager(3, 4)
    m.create_sequence("a")
    with pytest.raises(SequenceExistsError):
        m.create_sequence("a")
    with pytest.raises(UnknownSequenceError, match="create_sequence"):
        m.append_token("b")
    with pytest.raises(UnknownSequenceError):
        m.block_table("b")
    m.append_tokens("a", 5)
    before = state_of(m)
    with pytest.raises(NoFreeBlocksError) as info:
        m.append_tokens("a", 8)
    assert (info.value.needed, info.value.available) == (2, 1)
    assert isinstance(info.value, MemoryError)
    assert state_of(m) == before and m.invariants_ok()
    m.release_sequence("a")
    with pytest.raises(DoubleReleaseError, match="already released"):
        m.release_sequence("a")
    assert isinstance(DoubleReleaseError("x"), UnknownSequenceError)
    assert str(UnknownSequenceError("q")).startswith("no live sequence 'q'")
    m.create_sequence("a")                   # an id may be reused after release
    assert m.sequence_length("a") == 0
    with pytest.raises(ValueError):
        m.reserve_step({"a": -1})
    with pytest.raises(ValueError, match="twice"):
        m.reserve_step(["a", "a"])


def test_step_is_all_or_nothing_and_abort_restores_exactly():
    m = KVBlockManager(10, 4)
    for s, n in zip("abc", (4, 3, 8)):
        m.create_sequence(s)
        m.append_tokens(s, n)
    before = state_of(m)
    with pytest.raises(NoFreeBlocksError):
        m.reserve_step({"a": 1, "b": 1, "c": 40})
    assert state_of(m) == before
    step = m.reserve_step({"a": 5, "b": 1, "c": 1})
    assert step.slot_mapping.dtype == torch.int64 and step.positions.tolist() == [4, 5, 6, 7, 8, 3, 8]
    assert step.seq_lens.tolist() == [9, 4, 9] and step.seq_lens.dtype == torch.int32
    assert m.get_seq_lens_tensor("abc").tolist() == [9, 4, 9]
    assert m.sequence_length("a") == 4 and m.invariants_ok()
    for call in (lambda: m.reserve_step(["a"]), lambda: m.release_sequence("b"),
                 lambda: m.create_sequence("z"), lambda: m.append_token("b")):
        with pytest.raises(StepPendingError):
            call()
    m.abort_step(step)
    assert state_of(m) == before and m.invariants_ok()
    with pytest.raises(BlockManagerError):
        m.commit_step(step)                  # already aborted
    step = m.reserve_step({"a": 5, "b": 1, "c": 1})
    m.commit_step(step)
    assert [m.sequence_length(s) for s in "abc"] == [9, 4, 9] and m.invariants_ok()
    with pytest.raises(BlockManagerError):
        m.commit_step(step)                  # committed twice


def test_batch_tensors():
    m = KVBlockManager(20, 4)
    for s, n in zip("xyz", (9, 1, 4)):
        m.create_sequence(s)
        m.append_tokens(s, n)
    tables = m.get_block_table_tensor(["z", "x", "y"], pad_value=-1)
    assert tables.dtype == torch.int32 and tables.shape == (3, 3)
    assert tables[1].tolist() == m.block_table("x")
    assert tables[2].tolist() == m.block_table("y") + [-1, -1]
    assert m.get_seq_lens_tensor(["z", "x", "y"]).tolist() == [4, 9, 1]
    assert m.get_block_table_tensor([]).shape == (0, 0)
    with pytest.raises(UnknownSequenceError):
        m.get_seq_lens_tensor(["x", "nope"])


def test_decode_step_slot_mapping_matches_tables():
    rng = np.random.default_rng(3)
    m = KVBlockManager(2000, 16)
    ids = list(range(100))
    for s in ids:
        m.create_sequence(s)
        m.append_tokens(s, int(rng.integers(0, 300)))
    step = m.reserve_step(ids)
    tables = m.get_block_table_tensor(ids)
    for row, s in enumerate(ids):
        t = m.sequence_length(s)
        assert int(step.slot_mapping[row]) == int(tables[row, t // 16]) * 16 + t % 16
    m.commit_step(step)
    assert m.invariants_ok()


def test_first_inconsistency_names_the_block():
    m = KVBlockManager(8, 2)
    for s in "ab":
        m.create_sequence(s)
        m.append_tokens(s, 3)
    assert m.first_inconsistency() is None
    bad = copy.deepcopy(m)
    bad._seqs["b"].block_table[0] = bad._seqs["a"].block_table[1]
    assert f"block {m.block_table('a')[1]} is in the tables of both" in bad.first_inconsistency()
    bad = copy.deepcopy(m)
    bad._seqs["a"].length = 5
    assert "sequence 'a'" in bad.first_inconsistency()
    bad = copy.deepcopy(m)
    lost = bad._free.pop()
    assert f"block {lost} is neither free" in bad.first_inconsistency() and not bad.invariants_ok()


def test_teaching_manager_free_reuses_blocks():
    t = TeachingBlockManager(2, 2)
    assert [t.append("a") for _ in range(4)] == [0, 1, 2, 3]
    with pytest.raises(NoFreeBlocksError):
        t.append("b")
    assert "b" not in t.tables
    t.free("a")
    assert t.append("b") == 0  # freed in reverse, so block 0 is handed out again first


def test_failure_in_the_middle_of_a_step_leaves_state_unchanged(monkeypatch, fail_on_take):
    m = KVBlockManager(30, 2)
    for s in "abcd":
        m.create_sequence(s)
        m.append_tokens(s, 3)
    before = state_of(m)
    calls = fail_on_take(m, 3)
    with pytest.raises(RuntimeError, match="injected"):
        m.reserve_step({"a": 4, "b": 3, "c": 6, "d": 1})
    assert len(calls) == 3                      # two sequences had already been given blocks
    assert state_of(m) == before and m.invariants_ok() and m.pending_step is None
    monkeypatch.undo()
    step = m.reserve_step({"a": 4, "b": 3, "c": 6, "d": 1})   # and the manager still works
    m.commit_step(step)
    assert m.invariants_ok()


def test_the_generated_module_defines_each_method_once():
    """Chapter 4 grows its classes across cells; each method must still be defined once."""
    import ast
    import collections

    import minipaged.memory.block_manager as module

    tree = ast.parse(open(module.__file__).read())
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names = [n.name for n in node.body if isinstance(n, ast.FunctionDef)]
            twice = [n for n, count in collections.Counter(names).items() if count > 1]
            assert not twice, f"{node.name} defines {twice} more than once"


def test_tables_live_in_the_table_array():
    from minipaged.memory.block_manager import BlockTable, LiveSequences

    m = KVBlockManager(8, 2)
    m.create_sequence("a")
    m.append_tokens("a", 3)
    assert isinstance(m._seqs, LiveSequences) and type(m._seqs["a"].block_table) is BlockTable
    assert m._storage_inconsistency() is None
    m._seqs["a"].block_table = [0, 1]              # replaced, not edited in place
    assert "not attached" in m._storage_inconsistency() and not m.invariants_ok()
