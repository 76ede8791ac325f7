"""Chapter 5's event log accounts for every change: replayed from an empty pool, it rebuilds the
reference counts and block tables of the manager, after random programs of every operation
(fork, copy-on-write, aborted steps, swapping, releases, and chapter 6's cache hits)."""

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged.memory.block_manager import BlockManagerError
from minipaged.memory.prefix_cache import PrefixCachingBlockManager
from minipaged.memory.sharing import SharingBlockManager

# Weighted by repetition: steps and forks are what make copies-on-write.
OPS = ("create", "step", "step", "step", "abort", "fork", "fork", "release", "swap_out",
       "swap_in", "swap_in", "release_swapped", "prompt")


def run_program(manager, program):
    """Apply (op, a, b) triples; operations the manager refuses are part of the program too."""
    next_id = 0
    for op, a, b in program:
        live, swapped = manager.seq_ids(), manager.swapped_ids()
        try:
            if op in ("create", "prompt") or not live and op in ("step", "abort", "fork"):
                if op == "prompt" and isinstance(manager, PrefixCachingBlockManager):
                    prompt = [a % 3] * (1 + b % 9)
                    computed = manager.allocate_prompt(next_id, prompt)
                    manager.commit_step(manager.reserve_step({next_id: len(prompt) - computed}))
                else:
                    manager.create_sequence(next_id)
                next_id += 1
            elif op in ("step", "abort"):
                batch = {s: 1 + (a + i) % 3 for i, s in enumerate(live[b % len(live):][:3])}
                step = manager.reserve_step(batch)
                if op == "abort":
                    manager.abort_step(step)
                else:
                    manager.commit_step(step)
            elif op == "fork":
                manager.fork(live[a % len(live)], next_id)
                next_id += 1
            elif op == "release" and live:
                manager.release_sequence(live[a % len(live)])
            elif op == "swap_out" and live:
                manager.swap_out(live[a % len(live)])
            elif op == "swap_in" and swapped:
                manager.swap_in(swapped[a % len(swapped)])
            elif op == "release_swapped" and swapped:
                manager.release_swapped(swapped[a % len(swapped)])
        except (BlockManagerError, MemoryError):
            assert manager.pending_step is None


def live_tables(manager):
    return {s: manager.block_table(s) for s in manager.seq_ids() if manager.block_table(s)}


programs = st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 50), st.integers(0, 50)),
                    max_size=60)


@pytest.mark.parametrize("cls", [SharingBlockManager, PrefixCachingBlockManager])
@settings(max_examples=150, deadline=None)
@given(program=programs, block_size=st.sampled_from([2, 3, 4]))
def test_the_log_alone_rebuilds_counts_and_tables(cls, program, block_size):
    manager = cls(12, block_size, num_cpu_blocks=8, event_log_size=100_000)
    run_program(manager, program)
    counts, tables = SharingBlockManager.replay_events(manager.events)
    assert {b: counts.get(b, 0) for b in range(12)} == {b: manager.refcount(b) for b in range(12)}
    assert tables == live_tables(manager)
    assert manager.log_inconsistency() is None and manager.invariants_ok()


def test_copy_on_write_logs_the_source_count_dropping():
    m = SharingBlockManager(8, 4)
    m.create_sequence("a")
    m.append_tokens("a", 6)
    m.fork("a", "b")
    src = m.block_table("a")[1]
    m.append_token("b")
    cow = m.history("b")[-1]
    assert (cow.op, cow.block, cow.refcount) == ("cow", src, 1) == ("cow", src, m.refcount(src))
    assert m.log_inconsistency() is None


def test_the_replay_catches_a_silent_change():
    m = SharingBlockManager(8, 4)
    m.create_sequence("a")
    m.append_tokens("a", 6)
    m.fork("a", "b")
    bumped = copy.deepcopy(m)
    bumped._refcount[m.block_table("a")[0]] += 1
    assert bumped.log_inconsistency().startswith(f"block {m.block_table('a')[0]}: refcount 3")
    edited = copy.deepcopy(m)
    edited._seqs["b"].block_table.pop()
    assert "sequence 'b'" in edited.log_inconsistency()


def test_an_overflowed_log_says_so():
    m = SharingBlockManager(8, 4, event_log_size=3)
    m.create_sequence("a")
    m.append_tokens("a", 12)
    m.fork("a", "b")
    assert "incomplete" in m.log_inconsistency()


@pytest.mark.parametrize("cls", [SharingBlockManager, PrefixCachingBlockManager])
def test_first_inconsistency_checks_the_table_array(cls):
    m = cls(8, 4)
    m.create_sequence("a")
    m.append_tokens("a", 6)
    m.fork("a", "b")
    assert m.first_inconsistency() is None
    row = m._seqs["b"].block_table._row
    m._seqs.mirror.array[row, 0] = 7                 # the array disagrees with b's table
    problem = m.first_inconsistency()
    assert problem is not None and not m.invariants_ok()
    assert problem == m._seqs.mirror_inconsistency()
