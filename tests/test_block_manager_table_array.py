"""The persistent block-table array of chapter 4: BlockTable, BlockTableArray, LiveSequences, and the
manager's batch tensors built from them."""

import copy
import random

import pytest
import torch

from minipaged.memory.block_manager import (BlockTable, BlockTableArray, KVBlockManager,
                                            LiveSequences, SequenceState)
from minipaged.memory.prefix_cache import PrefixCachingBlockManager
from minipaged.memory.sharing import SharingBlockManager


def padded(tables, pad):
    width = max((len(t) for t in tables), default=0)
    return [list(t) + [pad] * (width - len(t)) for t in tables]


def test_every_list_mutation_is_mirrored():
    live = LiveSequences(BlockTableArray(rows=1, width=1))
    live["a"] = SequenceState("a", block_table=[3, 1, 4])
    table = live["a"].block_table
    assert type(table) is BlockTable
    reference = [3, 1, 4]
    edits = [
        lambda t: t.append(5), lambda t: t.extend([9, 2, 6]), lambda t: t.__setitem__(0, 8),
        lambda t: t.__setitem__(-1, 7), lambda t: t.__setitem__(slice(1, 3), [0]),
        lambda t: t.__delitem__(-1), lambda t: t.__delitem__(slice(-2, None)), lambda t: t.pop(0),
        lambda t: t.insert(1, 11), lambda t: t.remove(11), lambda t: t.reverse(), lambda t: t.sort(),
        lambda t: t.__iadd__([12, 13]), lambda t: t.__imul__(2), lambda t: t.clear(),
        lambda t: t.extend(range(40)), lambda t: t.__delitem__(slice(0, None, 3)),
    ]
    for edit in edits:
        edit(table)
        edit(reference)
        assert list(table) == reference
        assert live.mirror.gather(live.rows([live["a"]])).tolist() == padded([reference], 0)
        assert live.mirror_inconsistency() is None, edit


def test_rows_are_reused_zeroed_and_the_array_grows():
    live = LiveSequences(BlockTableArray(rows=2, width=2))
    for i in range(5):
        live[i] = SequenceState(i, block_table=list(range(i, 3 * i + 1)))
    assert live.mirror.num_rows >= 5 and live.mirror.array.shape[1] >= 9
    row_of_1 = live[1].block_table._row
    old = live.pop(1)
    assert old.block_table._mirror is None and old.block_table == [1, 2, 3]  # a plain list again
    assert not live.mirror.array[row_of_1].any()
    old.block_table.append(99)                       # a detached table no longer touches the array
    live["new"] = SequenceState("new", block_table=[5])
    assert live.mirror_inconsistency() is None
    del live[0]
    live[2] = SequenceState(2, block_table=[1])      # replacing a state gives the old row back
    assert live.mirror_inconsistency() is None
    live.clear()
    assert live.mirror_inconsistency() is None and not live.mirror.array.any()


def test_a_replaced_plain_list_is_reattached_and_the_checker_sees_it():
    live = LiveSequences(BlockTableArray())
    live["a"] = SequenceState("a", block_table=[1, 2])
    live["a"].block_table = [4, 5, 6]                # not the in-place edit the package makes
    assert "not attached" in live.mirror_inconsistency()
    assert live.mirror.gather(live.rows([live["a"]])).tolist() == [[4, 5, 6]]  # self-heals
    assert type(live["a"].block_table) is BlockTable


def test_checker_finds_a_corrupted_mirror():
    m = KVBlockManager(16, 2)
    for s in "ab":
        m.create_sequence(s)
        m.append_tokens(s, 5)
    assert m.invariants_ok()
    bad = copy.deepcopy(m)
    assert bad.invariants_ok()
    row = bad._seqs["a"].block_table._row
    bad._seqs.mirror.array[row, 0] += 1
    assert "row" in bad.first_inconsistency() and not bad.invariants_ok()
    assert m.invariants_ok()                         # the copy has its own array
    bad = copy.deepcopy(m)
    bad._seqs.mirror._free_rows.append(bad._seqs["b"].block_table._row)
    assert "partition" in bad.first_inconsistency()


def test_tensor_is_a_copy_and_pads():
    m = KVBlockManager(32, 4)
    for s, n in (("a", 9), ("b", 2)):
        m.create_sequence(s)
        m.append_tokens(s, n)
    t = m.get_block_table_tensor(["b", "a"], pad_value=-1)
    assert t.dtype == torch.int32 and t.tolist() == padded([m.block_table("b"), m.block_table("a")], -1)
    t[0, 0] = 99
    assert m.get_block_table_tensor(["b"]).tolist() == [m.block_table("b")]
    snapshot = m.get_block_table_tensor(["a"]).clone()
    kept = m.get_block_table_tensor(["a"])
    m.append_tokens("a", 8)
    m.release_sequence("a")
    assert torch.equal(kept, snapshot)
    assert m.get_block_table_tensor([]).shape == (0, 0)


@pytest.mark.parametrize("make", [lambda: KVBlockManager(96, 3),
                                  lambda: SharingBlockManager(96, 3, num_cpu_blocks=48),
                                  lambda: PrefixCachingBlockManager(96, 3, num_cpu_blocks=48)])
def test_random_operations_keep_tensor_and_slots_equal_to_the_tables(make):
    """Steps, aborts, forks (copy-on-write), swaps and releases: after every operation the batch
    tensor equals the tables and every reserved slot is table[t // B] * B + t % B."""
    rng = random.Random(7)
    m, live, next_id = make(), [], 0
    seen = {"commit": 0, "abort": 0, "copies": 0, "swap_in": 0}
    sharing = isinstance(m, SharingBlockManager)
    for _ in range(400):
        op = rng.random()
        if op < 0.2 or not live:
            m.create_sequence(next_id)
            live.append(next_id)
            next_id += 1
        elif op < 0.3 and sharing:
            m.fork(rng.choice(live), next_id)
            live.append(next_id)
            next_id += 1
        elif op < 0.42 or m.num_free_blocks < 30:  # releases keep the pool from filling up
            seq = live.pop(rng.randrange(len(live)))
            if sharing and m.num_free_cpu_blocks >= len(m.block_table(seq)) and rng.random() < 0.5:
                m.swap_out(seq)
                if m.num_free_blocks >= len(m._swapped[seq].block_table):
                    m.swap_in(seq)
                    live.append(seq)
                    seen["swap_in"] += 1
                else:
                    m.release_swapped(seq)
            else:
                m.release_sequence(seq)
        else:
            batch = rng.sample(live, rng.randint(1, len(live)))
            counts = {s: rng.choice([1, 1, 1, 2, 5]) for s in batch}
            try:
                step = m.reserve_step(counts)
            except MemoryError:
                continue
            tables = m.get_block_table_tensor(list(counts))
            lens = m.get_seq_lens_tensor(list(counts))
            assert torch.equal(lens, step.seq_lens)
            i = 0
            for row, (s, n) in enumerate(counts.items()):
                for t in range(int(lens[row]) - n, int(lens[row])):
                    assert int(step.positions[i]) == t
                    assert int(step.slot_mapping[i]) == int(tables[row, t // 3]) * 3 + t % 3
                    i += 1
            seen["copies"] += len(step.copies)
            kind = "abort" if rng.random() < 0.2 else "commit"
            (m.abort_step if kind == "abort" else m.commit_step)(step)
            seen[kind] += 1
        seqs = m.seq_ids()
        assert m.get_block_table_tensor(seqs).tolist() == padded([m.block_table(s) for s in seqs], 0)
        assert m.invariants_ok(), m.first_inconsistency()
    assert seen["commit"] > 30 and seen["abort"] > 5
    if sharing:
        assert seen["copies"] > 0 and seen["swap_in"] > 0, seen
