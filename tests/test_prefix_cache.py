"""Focused unit tests of minipaged.memory.prefix_cache (chapter 6)."""

import pytest

from minipaged.memory.block_manager import SequenceExistsError, StepPendingError, UnknownSequenceError
from minipaged.memory.prefix_cache import LRUFreeBlockQueue, PrefixCachingBlockManager, chained_block_hash


def prefill(m, seq, prompt):
    cached = m.allocate_prompt(seq, prompt)
    m.commit_step(m.reserve_step({seq: len(prompt) - cached}))
    return cached


def test_lru_queue_order_and_removal():
    q = LRUFreeBlockQueue([3, 1, 2])
    assert list(q) == [3, 1, 2] and 1 in q and len(q) == 3
    q.remove(1)
    q.push(1)
    q.push_front(7)
    q.unpop(8)
    assert [q.pop() for _ in range(5)] == [8, 7, 3, 2, 1]
    with pytest.raises(KeyError):
        q.remove(42)


def test_hits_are_full_blocks_and_never_the_last_token():
    m = PrefixCachingBlockManager(32, 4)
    assert prefill(m, "a", list(range(12))) == 0
    assert m.num_cached_blocks == 3
    assert m.cached_prefix_length(list(range(12))) == 8        # 12 tokens: (12-1)//4 = 2 blocks
    assert m.cached_prefix_length(list(range(13))) == 12
    assert m.cached_prefix_length(list(range(3))) == 0
    assert m.cached_prefix_length([]) == 0
    assert prefill(m, "b", list(range(13))) == 12
    assert m.block_table("b")[:3] == m.block_table("a")
    assert all(m.refcount(b) == 2 for b in m.block_table("a"))
    assert m.stats.queries == 25 and m.stats.hits == 12
    assert m.invariants_ok()


def test_num_blocks_for_prompt_counts_revived_hits():
    m = PrefixCachingBlockManager(16, 4)
    prefill(m, "a", list(range(10)))
    prompt = list(range(10)) + [1, 2, 3]
    assert m.num_blocks_for_prompt(prompt) == 2                # 2 hits in use + 2 new blocks... no: 4 - 2
    m.release_sequence("a")
    assert m.num_blocks_for_prompt(prompt) == 4                # 2 revived + 2 new
    free = m.num_free_blocks
    cached = m.allocate_prompt("b", prompt)
    step = m.reserve_step({"b": len(prompt) - cached})
    assert free - m.num_free_blocks == 4
    m.commit_step(step)


def test_decode_blocks_are_cached_once_tokens_are_known():
    m = PrefixCachingBlockManager(16, 2)
    prefill(m, "a", [1, 2, 3])
    assert m.num_cached_blocks == 1
    m.append_token_ids("a", [4])
    m.commit_step(m.reserve_step(["a"]))                       # writes token 4: block (3, 4) fills
    assert m.num_cached_blocks == 2
    assert m.cached_prefix_length([1, 2, 3, 4, 5]) == 4
    m.commit_step(m.reserve_step(["a"]))                       # a token the manager was not told
    m.commit_step(m.reserve_step(["a"]))
    assert m.num_cached_blocks == 2                            # unknown tokens are not cached
    assert m.token_ids("a") == [1, 2, 3, 4]


def test_eviction_is_lazy_lru_and_tail_first():
    m = PrefixCachingBlockManager(4, 2)
    prefill(m, "a", [1, 2, 3, 4, 5])                           # blocks (1,2) (3,4) cached, (5) not
    m.release_sequence("a")
    assert m.num_free_blocks == 4 and m.num_cached_blocks == 2
    prefill(m, "b", [9, 9, 9, 9, 9])                           # 3 blocks: 2 empty ones, then an eviction
    assert m.stats.evictions == 1
    assert m.cached_prefix_length([1, 2, 3, 4, 5]) == 2        # the tail (3, 4) went first
    assert m.invariants_ok()


def test_collisions_never_return_wrong_blocks():
    m = PrefixCachingBlockManager(64, 2, hash_fn=lambda parent, tokens: 1)
    prefill(m, "x", [1, 2, 3, 4, 5])
    prefill(m, "y", [6, 6, 3, 4, 5])
    assert m.cached_prefix_length([1, 2, 3, 4, 9]) == 4
    assert m.cached_prefix_length([6, 6, 3, 4, 9]) == 4
    assert m.cached_prefix_length([1, 2, 6, 6, 9]) == 2
    assert m.cached_prefix_length([7, 7, 3, 4, 9]) == 0
    cached = m.allocate_prompt("z", [6, 6, 3, 4, 0])
    assert m.block_table("z") == m.block_table("y")[:2] and cached == 4


def test_parent_identity_survives_block_reuse():
    """A child entry whose parent block was reused for other content must not match the new content."""
    m = PrefixCachingBlockManager(3, 2, hash_fn=lambda parent, tokens: 0)
    prefill(m, "a", [1, 2, 3, 4, 0])
    a0, a1, a2 = m.block_table("a")
    m.release_sequence("a")
    assert list(m._free) == [a2, a1, a0]
    m._free.remove(a0)                                         # make the parent block go first
    m._free.push_front(a0)
    prefill(m, "b", [7, 7, 0])                                 # takes a0 (evicting (1, 2)), then a2
    assert m.block_table("b") == [a0, a2] and m.is_cached(a1) and m.is_cached(a0)
    # (7, 7) now lives in block a0; the cached (3, 4) was computed after (1, 2), not after (7, 7).
    assert m.cached_prefix_length([7, 7, 3, 4, 0]) == 2
    assert m.cached_prefix_length([1, 2, 3, 4, 0]) == 0
    assert m.invariants_ok()


def test_caching_off_behaves_like_chapter_5():
    m = PrefixCachingBlockManager(16, 4, enable_prefix_caching=False)
    prefill(m, "a", list(range(9)))
    assert m.num_cached_blocks == 0 and prefill(m, "b", list(range(9))) == 0
    assert m.stats.hit_rate == 0.0


def test_fork_swap_release_keep_cache_consistent():
    m = PrefixCachingBlockManager(12, 4, num_cpu_blocks=6)
    prefill(m, "a", list(range(10)))
    m.fork("a", "b")
    m.append_token_ids("b", [50, 51])
    m.commit_step(m.reserve_step({"b": 2}))                    # copy-on-write, then block 2 of b fills
    assert m.num_cached_blocks == 3 and m.invariants_ok()
    pairs = m.swap_out("b")
    assert len(pairs) == 3 and m.invariants_ok()
    with pytest.raises(UnknownSequenceError):
        m.append_token("b")
    m.append_token_ids("b", [52])
    m.swap_in("b")
    m.commit_step(m.reserve_step(["b"]))
    assert m.token_ids("b") == list(range(10)) + [50, 51, 52] and m.invariants_ok()
    m.release_sequence("a")
    m.release_sequence("b")
    assert m.num_free_blocks == 12 and m.invariants_ok()
    with pytest.raises(UnknownSequenceError):
        m.append_token_ids("b", [1])
    with pytest.raises(SequenceExistsError):
        m.allocate_prompt("c", [1]) or m.allocate_prompt("c", [1])
    step = m.reserve_step(["c"])
    with pytest.raises(StepPendingError):
        m.allocate_prompt("d", [1, 2])
    m.abort_step(step)


def test_reconciliation_sees_cache_damage():
    import copy
    m = PrefixCachingBlockManager(8, 2)
    prefill(m, "a", [1, 2, 3, 4, 5])
    bad = copy.deepcopy(m)
    block = m.block_table("a")[0]
    bad._block_hash[block] = None
    assert f"block {block}" in bad.first_inconsistency()
    bad = copy.deepcopy(m)
    bad._cache.clear()
    assert "listed 0" in bad.first_inconsistency()


def test_chained_hash_depends_on_parent():
    assert chained_block_hash(None, (1, 2)) != chained_block_hash(5, (1, 2))
    assert chained_block_hash(5, (1, 2)) == chained_block_hash(5, (1, 2))


def test_tokens_told_late_are_cached_at_the_next_step():
    m = PrefixCachingBlockManager(16, 2)
    prefill(m, "a", [1, 2, 3])
    m.commit_step(m.reserve_step(["a"]))                       # block (3, ?) fills, token unknown
    assert m.num_cached_blocks == 1
    m.append_token_ids("a", [4, 5])                            # told late: tokens 4 and 5
    m.commit_step(m.reserve_step(["a"]))                       # writes token 5, no boundary crossed
    assert m.num_cached_blocks == 2 and m.cached_prefix_length([1, 2, 3, 4, 9]) == 4
    assert m.invariants_ok()


def test_swapped_in_blocks_are_cached_again():
    m = PrefixCachingBlockManager(6, 2, num_cpu_blocks=4)
    prefill(m, "a", [1, 2, 3, 4, 5])
    m.swap_out("a")
    m.release_sequence("a") if "a" in m else None
    prefill(m, "b", [8] * 9)                                   # 5 blocks: evicts the tail entry
    assert m.cached_prefix_length([1, 2, 3, 4, 5]) < 4
    m.release_sequence("b")
    m.swap_in("a")
    m.append_token_ids("a", [6])
    m.commit_step(m.reserve_step(["a"]))
    assert m.cached_prefix_length([1, 2, 3, 4, 5]) == 4 and m.invariants_ok()


def test_abort_restores_tables_but_keeps_evicted_blocks_evicted():
    """An aborted step gives back every block it took, in queue order; a cached block it evicted
    stays evicted, because the failed forward may already have written into it."""
    m = PrefixCachingBlockManager(4, 2)
    prefill(m, "a", [1, 2, 3, 4, 5])                           # 3 blocks; (1,2) and (3,4) cached
    m.release_sequence("a")
    free_order = list(m._free)
    m.create_sequence("b")
    reservation = m.reserve_step({"b": 7})                    # 4 blocks: both cached ones evicted
    assert m.num_free_blocks == 0 and m.num_cached_blocks == 0
    m.abort_step(reservation)
    assert "b" in m and m.sequence_length("b") == 0 and m.block_table("b") == []
    assert list(m._free) == free_order and m.num_free_blocks == 4
    assert m.num_cached_blocks == 0 and m.cached_prefix_length([1, 2, 3, 4, 5]) == 0
    assert m.invariants_ok()


# The engine-facing API of chapter 6's table ("these calls and no others").
ENGINE_API = {"match_prefix", "num_blocks_for_prompt", "cached_prefix_length", "allocate_prompt",
              "num_blocks_to_allocate",
              "can_reserve", "reserve_step", "get_block_table_tensor", "get_seq_lens_tensor",
              "commit_step", "abort_step", "append_token_ids", "fork", "release_sequence",
              "release_swapped", "swap_out", "swap_in", "block_size", "num_physical_blocks",
              "num_free_blocks", "num_free_cpu_blocks", "seq_ids", "sequence_length", "block_table",
              "stats", "invariants_ok", "first_inconsistency", "create_sequence",
              # chapter 4's seam, which the scheduler goes through
              "usage", "find_cached_prefix", "end_step", "move", "inconsistency_with"}


def test_scheduler_and_engine_use_only_the_documented_manager_api():
    import ast
    from pathlib import Path

    import minipaged

    used = set()
    for name in ("engine/scheduler.py", "engine/llm_engine.py"):
        tree = ast.parse((Path(minipaged.__file__).parent / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                owner = node.value
                owner_name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", None)
                if owner_name in ("manager", "block_manager"):
                    used.add(node.attr)
    assert used, "no use of the block manager found: did its attribute name change?"
    assert used <= ENGINE_API, f"calls missing from chapter 6's engine-facing API table: {used - ENGINE_API}"
    m = PrefixCachingBlockManager(4, 2, 2)
    assert all(hasattr(m, name) for name in ENGINE_API)


def test_admission_looks_a_waiting_prompt_up_once_per_step(monkeypatch):
    """The scheduler hands match_prefix's hits to num_blocks_for_prompt and allocate_prompt
    instead of matching the prompt again (vLLM v1: get_computed_blocks -> allocate_slots)."""
    from minipaged.engine.scheduler import SamplingParams, Scheduler, SchedulerConfig, Sequence

    m = PrefixCachingBlockManager(num_physical_blocks=16, block_size=4)
    scheduler = Scheduler(m, SchedulerConfig(max_model_len=64))
    calls = []
    real = m._match
    monkeypatch.setattr(m, "_match", lambda *a: calls.append(a) or real(*a))
    scheduler.add(Sequence(0, 0, list(range(10)), SamplingParams(max_tokens=2, ignore_eos=True)))
    out = scheduler.schedule()
    assert len(calls) == 1 and out.admitted
