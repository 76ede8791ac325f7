"""Stateful (hypothesis) tests of the block managers: random operation sequences, invariants after every step.

Every token written gets a unique sentinel in a fake cache (slot -> sentinel); after each rule the
cache, read back through each sequence's block table, must give exactly that sequence's tokens.
"""

import os

import torch
from collections import Counter

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from minipaged.memory.block_manager import KVBlockManager, NoFreeBlocksError

# 150 programs per state machine in CI; HYPOTHESIS_PROFILE=long runs 2,000 (the release check).
PROGRAMS = {"long": 2000}.get(os.environ.get("HYPOTHESIS_PROFILE", ""), 150)
SETTINGS = settings(max_examples=PROGRAMS, stateful_step_count=50, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def check_conservation(m):
    """The chapter-4 conservation laws, derived from scratch (not through the manager's own check)."""
    free = list(m._free)
    in_tables = [b for s in m.seq_ids() for b in m.block_table(s)]
    assert len(free) == len(set(free)) == m.num_free_blocks
    assert not set(free) & set(in_tables), "a block is free and allocated"
    assert set(free) | set(in_tables) == set(range(m.num_physical_blocks)), "a block is lost"
    for s in m.seq_ids():
        state = m._seqs[s]
        assert len(state.block_table) == -(-(state.length + state.reserved) // m.block_size)


class BlockManagerMachine(RuleBasedStateMachine):
    """Create / append / reserve-commit / reserve-abort / release / cancel on a small pool."""

    manager_class = KVBlockManager

    def __init__(self):
        super().__init__()
        self.m = self.manager_class(num_physical_blocks=12, block_size=3)
        self.tokens: dict[int, list] = {}     # the model: each sequence's sentinels, in order
        self.cache: dict[int, object] = {}    # the fake KV cache: slot -> sentinel
        self.next_id = 0
        self.next_token = 0
        self.step = None

    # -- helpers --
    def sentinel(self, seq):
        self.next_token += 1
        return (seq, self.next_token)

    def write(self, reservation):
        """What the engine does with a reservation: copies first, then the new tokens' KV."""
        for src, dst in reservation.copies:
            bs = self.m.block_size
            for off in range(bs):
                if src * bs + off in self.cache:
                    self.cache[dst * bs + off] = self.cache[src * bs + off]
        written = []
        slots = reservation.slot_mapping.tolist()
        positions = reservation.positions.tolist()
        i = 0
        for seq, n in zip(reservation.seq_ids, reservation.num_new_tokens):
            for _ in range(n):
                value = self.value(seq, positions[i])
                self.cache[slots[i]] = value
                written.append((seq, value))
                i += 1
        return written

    def value(self, seq, position):
        """What the KV of this token is: here a unique (sequence, counter) sentinel."""
        return self.sentinel(seq)

    def live(self):
        return sorted(self.tokens)

    # -- rules --
    @precondition(lambda self: self.step is None)
    @rule()
    def create(self):
        self.m.create_sequence(self.next_id)
        self.tokens[self.next_id] = []
        self.on_create(self.next_id)
        self.next_id += 1

    def on_create(self, seq):
        pass

    def plan(self, data):
        """The step's batch: {seq: number of new tokens}."""
        seqs = data.draw(st.lists(st.sampled_from(self.live()), unique=True, min_size=1))
        return {s: data.draw(st.integers(0, 7)) for s in seqs}

    @precondition(lambda self: self.step is None and self.tokens)
    @rule(data=st.data(), commit=st.booleans())
    def step_batch(self, data, commit):
        counts = self.plan(data)
        before = self.snapshot()
        try:
            reservation = self.m.reserve_step(counts)
        except NoFreeBlocksError:
            assert self.snapshot() == before, "a failed reservation changed the manager"
            return
        tables = self.m.get_block_table_tensor(reservation.seq_ids)
        assert torch.equal(reservation.block_tables, tables), "the step's tables are stale"
        written = self.write(reservation)
        if commit:
            self.m.commit_step(reservation)
            for seq, value in written:
                self.tokens[seq].append(value)
        else:
            self.m.abort_step(reservation)
            assert self.snapshot() == before, "abort did not restore the manager"

    @precondition(lambda self: self.step is None and self.tokens)
    @rule(data=st.data())
    def reserve_only(self, data):
        """Leave a step in flight; the next rule must commit or abort it."""
        try:
            self.step = self.m.reserve_step(self.plan(data))
        except NoFreeBlocksError:
            return
        self.step_written = self.write(self.step)

    @precondition(lambda self: self.step is not None)
    @rule(commit=st.booleans())
    def finish_step(self, commit):
        if commit:
            self.m.commit_step(self.step)
            for seq, value in self.step_written:
                self.tokens[seq].append(value)
        else:
            self.m.abort_step(self.step)
        self.step = None

    @precondition(lambda self: self.step is None and self.tokens)
    @rule(data=st.data())
    def release(self, data):
        """Finish or cancel a sequence (cancellation mid-generation is the same call)."""
        seq = data.draw(st.sampled_from(self.live()))
        self.m.release_sequence(seq)
        del self.tokens[seq]
        self.on_release(seq)

    def on_release(self, seq):
        pass

    # -- checks after every rule --
    def snapshot(self):
        return ({s: (self.m.block_table(s), self.m.sequence_length(s)) for s in self.m.seq_ids()},
                sorted(self.m._free), self.m.num_free_blocks)

    @invariant()
    def conservation(self):
        check_conservation(self.m)
        assert self.m.invariants_ok(), self.m.first_inconsistency()

    @invariant()
    def sentinels_read_back(self):
        bs = self.m.block_size
        assert sorted(self.m.seq_ids()) == self.live()
        for seq, values in self.tokens.items():
            assert self.m.sequence_length(seq) == len(values)
            table = self.m.block_table(seq)
            got = [self.cache.get(table[t // bs] * bs + t % bs) for t in range(len(values))]
            assert got == values, f"sequence {seq} reads back another's KV"

    @invariant()
    def table_tensor_matches_tables(self):
        """The gathered block-table tensor (from the persistent array) equals the tables, padded."""
        seqs = self.m.seq_ids()
        tables = [self.m.block_table(s) for s in seqs]
        width = max((len(t) for t in tables), default=0)
        got = self.m.get_block_table_tensor(seqs, pad_value=-1).tolist()
        assert got == [t + [-1] * (width - len(t)) for t in tables]


TestBlockManager = BlockManagerMachine.TestCase
TestBlockManager.settings = SETTINGS


# ---- chapter 5: reference counts, fork, copy-on-write, swapping ----------------------------------

from minipaged.memory.sharing import SharingBlockManager  # noqa: E402


def check_sharing(m):
    """Every block's count equals the tables holding it; free exactly when the count is 0; CPU pool too."""
    holders = Counter(b for s in m.seq_ids() for b in m.block_table(s))
    free = set(m._free)
    for block in range(m.num_physical_blocks):
        assert m.refcount(block) == holders.get(block, 0), f"block {block}: count != holders"
        assert (block in free) == (m.refcount(block) == 0), f"block {block}: free iff count 0"
    cpu_places = Counter(m._cpu_free)
    for s in m.swapped_ids():
        cpu_places.update(m._swapped[s].block_table)
    assert cpu_places == Counter(range(m.num_cpu_blocks)), "a CPU block is lost or in two places"
    assert not set(m.seq_ids()) & set(m.swapped_ids())


class SharingMachine(BlockManagerMachine):
    """Adds fork (copy-on-write on the next write), swap out / swap in, and release while swapped."""

    def __init__(self):
        super().__init__()
        self.m = SharingBlockManager(num_physical_blocks=12, block_size=3, num_cpu_blocks=8)
        self.cpu_cache: dict[int, object] = {}
        self.swapped: dict[int, list] = {}

    @precondition(lambda self: self.step is None and self.tokens)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(self.live()))
        self.m.fork(parent, self.next_id)
        self.tokens[self.next_id] = list(self.tokens[parent])
        self.on_fork(parent, self.next_id)
        self.next_id += 1

    def on_fork(self, parent, child):
        pass

    @precondition(lambda self: self.step is None and self.tokens)
    @rule(data=st.data())
    def swap_out(self, data):
        seq = data.draw(st.sampled_from(self.live()))
        if self.move_blocks(self.m.swap_out, seq, self.cache, self.cpu_cache):
            self.swapped[seq] = self.tokens.pop(seq)

    @precondition(lambda self: self.step is None and self.swapped)
    @rule(data=st.data(), release=st.booleans())
    def swap_in_or_drop(self, data, release):
        seq = data.draw(st.sampled_from(sorted(self.swapped)))
        if release:
            self.m.release_swapped(seq)
            del self.swapped[seq]
            self.on_release(seq)
            return
        if self.move_blocks(self.m.swap_in, seq, self.cpu_cache, self.cache):
            self.tokens[seq] = self.swapped.pop(seq)

    def move_blocks(self, swap, seq, src_cache, dst_cache) -> bool:
        """Run ``swap(seq)``; copy the slots of each (src, dst) block pair it returns between the
        model caches. A refused swap (no free blocks) must leave the manager as it was."""
        before = self.snapshot()
        try:
            pairs = swap(seq)
        except NoFreeBlocksError:
            assert self.snapshot() == before
            return False
        bs = self.m.block_size
        for src, dst in pairs:
            for off in range(bs):
                dst_cache[dst * bs + off] = src_cache.get(src * bs + off)
        return True

    def snapshot(self):
        return (super().snapshot(), [self.m.refcount(b) for b in range(self.m.num_physical_blocks)],
                sorted(self.m._cpu_free), {s: self.m._swapped[s].block_table for s in self.m.swapped_ids()})

    @invariant()
    def refcounts_match_tables(self):
        check_sharing(self.m)
        assert sorted(self.m.swapped_ids()) == sorted(self.swapped)


TestSharing = SharingMachine.TestCase
TestSharing.settings = SETTINGS


# ---- chapter 6: prefix caching (with a colliding hash), eviction, chunked prefill -------------

from minipaged.memory.prefix_cache import PrefixCachingBlockManager  # noqa: E402


def weak_hash(parent, tokens):
    """Collides all the time, so every hit must be verified by tokens and parent."""
    return ((parent or 0) + sum(tokens)) % 3


class PrefixMachine(SharingMachine):
    """Prompts over a 3-token vocabulary (so prefixes repeat), admitted with prefix-cache hits.

    The fake KV of position t is the tuple of all tokens up to t: that is what the real keys and
    values depend on, so a wrong hit (wrong tokens or wrong history) reads back as a mismatch.
    """

    def __init__(self):
        super().__init__()
        self.m = PrefixCachingBlockManager(num_physical_blocks=12, block_size=3, num_cpu_blocks=8,
                                           hash_fn=weak_hash)
        self.known: dict[int, list[int]] = {}

    @precondition(lambda self: self.step is None)
    @rule(prompt=st.lists(st.integers(0, 2), min_size=1, max_size=10))
    def admit(self, prompt):
        seq = self.next_id
        self.next_id += 1
        cached = self.m.allocate_prompt(seq, prompt)
        bs = self.m.block_size
        assert cached % bs == 0 and cached <= (len(prompt) - 1) // bs * bs
        self.known[seq] = list(prompt)
        self.tokens[seq] = [tuple(prompt[:t + 1]) for t in range(cached)]

    def plan(self, data):
        seqs = data.draw(st.lists(st.sampled_from(self.live()), unique=True, min_size=1))
        counts = {}
        for seq in seqs:
            pending = len(self.known[seq]) - self.m.sequence_length(seq)
            if pending == 0:                      # decode: a freshly sampled token
                token = data.draw(st.integers(0, 2))
                self.m.append_token_ids(seq, [token])
                self.known[seq].append(token)
                pending = 1
            counts[seq] = data.draw(st.integers(1, pending))   # chunked prefill allowed
        return counts

    def value(self, seq, position):
        return tuple(self.known[seq][:position + 1])

    def on_create(self, seq):
        self.known[seq] = []

    def on_fork(self, parent, child):
        self.known[child] = list(self.known[parent])

    def on_release(self, seq):
        del self.known[seq]

    @invariant()
    def cache_entries_are_truthful(self):
        m, bs = self.m, self.m.block_size
        for blocks in m._cache.values():
            for block in blocks:
                content = self.cache.get(block * bs + bs - 1)
                assert content is not None and content[-bs:] == m._block_tokens[block]
                parent = m._block_parent[block]
                if parent is None:
                    assert len(content) == bs
                elif m._generation[parent[0]] == parent[1]:
                    assert self.cache.get(parent[0] * bs + bs - 1) == content[:-bs]
        for seq in self.live():
            assert m.token_ids(seq) == self.known[seq]


TestPrefixCache = PrefixMachine.TestCase
TestPrefixCache.settings = SETTINGS
