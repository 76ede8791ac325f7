# GENERATED from chapters/05_sharing.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/05_sharing.md § Reference counts and fork
"""Shared blocks: reference counts, fork, copy-on-write, swapping to a CPU pool,
debugging aids."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Literal, NamedTuple

import numpy as np

from minipaged.memory.block_manager import (BlockManagerError, FreeBlockList, KVBlockManager,
                                            KVUsage, NoFreeBlocksError, SequenceExistsError,
                                            SequenceState, StepReservation, UnknownSequenceError)
from minipaged.memory.sizing import ceil_div

__all__ = ["BlockEvent", "SharingBlockManager", "parallel_sampling_savings",
           "beam_search_savings"]


class BlockEvent(NamedTuple):
    """One change to a block's ownership, with the block's reference count after it.

    ``op`` is one of ``alloc`` (taken from the free list: appended to ``seq_id``'s
    table), ``ref`` (appended to ``seq_id``'s table while others hold it: a fork, or
    an undone copy), ``unref`` (removed from ``seq_id``'s table), ``free`` (the count
    reached zero), ``cow`` (``seq_id`` stopped sharing ``block``: the block it
    allocated just before replaces it), ``untake`` (an aborted step gave a fresh block
    back), ``swap_out`` / ``swap_in`` (``block`` is the GPU block, ``detail`` names the
    CPU one).
    """

    index: int
    op: str
    seq_id: Hashable
    block: int
    refcount: int
    detail: str = ""


# %% chapters/05_sharing.md § Reference counts and fork
class SharingBlockManager(KVBlockManager):
    """A ``KVBlockManager`` whose blocks can be shared between sequences.

    Adds a reference count per block, ``fork``, copy-on-write (a reservation's
    ``copies`` are (src, dst) block copies the cache must run before the step writes),
    swapping whole sequences to a pool of ``num_cpu_blocks`` CPU blocks (``swap_out`` /
    ``swap_in`` return copy lists), an event log (``events``) and
    ``first_inconsistency()`` over blocks, counts, free lists and both pools.
    """

    _BATCH_COUNT_MIN = 32  # below this many sequences, counting one by one beats NumPy

    def __init__(self, num_physical_blocks: int, block_size: int,
                 num_cpu_blocks: int = 0, event_log_size: int = 4096) -> None:
        super().__init__(num_physical_blocks, block_size)
        if (isinstance(num_cpu_blocks, bool) or not isinstance(num_cpu_blocks, int)
                or num_cpu_blocks < 0):
            raise ValueError("num_cpu_blocks must be an integer >= 0, "
                             f"got {num_cpu_blocks!r}")
        self._refcount = [0] * num_physical_blocks
        self.num_cpu_blocks = num_cpu_blocks
        self._cpu_free = FreeBlockList(range(num_cpu_blocks))
        self._swapped: dict[Hashable, SequenceState] = {}
        self.events: deque[BlockEvent] = deque(maxlen=event_log_size)
        self._num_events = 0

    def _log(self, op: str, seq_id: Hashable, block: int, detail: str = "") -> None:
        self._num_events += 1
        if self.events.maxlen:
            self.events.append(BlockEvent(self._num_events, op, seq_id, block,
                                          self._refcount[block], detail))

    def refcount(self, block: int) -> int:
        """How many block tables list GPU block ``block`` (0: free)."""
        return self._refcount[block]

    def _take_blocks(self, n: int, seq_id: Hashable) -> list[int]:
        blocks = super()._take_blocks(n, seq_id)
        for block in blocks:
            self._refcount[block] = 1
            self._log("alloc", seq_id, block)
        return blocks

    def _drop_block(self, block: int, seq_id: Hashable) -> None:
        self._refcount[block] -= 1
        self._log("unref", seq_id, block)
        if self._refcount[block] == 0:
            super()._drop_block(block, seq_id)
            self._log("free", seq_id, block)

    def _untake_block(self, block: int) -> None:
        self._refcount[block] = 0
        super()._untake_block(block)
        self._log("untake", None, block)

    # %% chapters/05_sharing.md § Reference counts and fork
    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        """Start ``child_id`` as a copy of ``parent_id``, sharing every block (no copy)."""
        self._check_no_step(f"fork {parent_id!r}")
        parent = self._state(parent_id)
        if child_id in self._seqs or child_id in self._swapped:
            raise SequenceExistsError(child_id)
        child = SequenceState(child_id, parent.length, list(parent.block_table))
        for block in child.block_table:
            self._refcount[block] += 1
            self._log("ref", child_id, block, f"fork of {parent_id!r}")
        self._seqs[child_id] = child
        self._released.pop(child_id, None)

    # %% chapters/05_sharing.md § Reference counts and fork
    def first_inconsistency(self) -> str | None:
        """Reconcile tables, reference counts, free lists of both pools and the table array;
        name the first bad block (None: all consistent)."""
        bs, n = self.block_size, self.num_physical_blocks
        holders: list[list[Hashable]] = [[] for _ in range(n)]
        for seq_id, state in self._seqs.items():
            if len(state.block_table) != ceil_div(state.length + state.reserved, bs):
                return (f"sequence {seq_id!r}: {len(state.block_table)} table entries for "
                        + f"{state.length}+{state.reserved} tokens at block size {bs}")
            if len(set(state.block_table)) != len(state.block_table):
                return f"sequence {seq_id!r} lists one block twice: {state.block_table}"
            for block in state.block_table:
                if not 0 <= block < n:
                    return f"block {block} of sequence {seq_id!r} is outside the pool"
                holders[block].append(seq_id)
        in_free = Counter(self._free)
        for block in sorted(in_free):
            if not 0 <= block < n:
                return f"block {block} in the free list is outside the pool"
        for block in range(n):
            count, held_by = self._refcount[block], holders[block]
            free = in_free.get(block, 0)
            if free > 1:
                return f"block {block} is {free} times in the free list"
            if count != len(held_by):
                return (f"block {block}: refcount {count} but {len(held_by)} table(s) "
                        + f"hold it {held_by[:4]}")
            if count == 0 and not free:
                return f"block {block}: refcount 0 but not in the free list (leaked)"
            if count > 0 and free:
                return f"block {block} is in the free list but held by {held_by[:4]}"
        return self._cpu_inconsistency() or self._seqs.mirror_inconsistency()

    def _cpu_inconsistency(self) -> str | None:
        places = Counter(self._cpu_free)
        for state in self._swapped.values():
            places.update(state.block_table)
            if len(state.block_table) != ceil_div(state.length, self.block_size):
                return (f"swapped sequence {state.seq_id!r}: {len(state.block_table)} CPU "
                        + f"blocks for {state.length} tokens")
        for block in range(self.num_cpu_blocks):
            if places.get(block, 0) != 1:
                return (f"CPU block {block} is in {places.get(block, 0)} places "
                        + "(free list + swapped tables)")
        extra = set(places) - set(range(self.num_cpu_blocks))
        return f"CPU block {min(extra)} is outside the CPU pool" if extra else None

    # %% chapters/05_sharing.md § Copy-on-write
    def _shared_partial_block(self, state: SequenceState, position: int) -> int | None:
        """Table index of the block token ``position`` writes into, if it is shared."""
        if position % self.block_size == 0:
            return None  # the token starts a fresh block
        index = position // self.block_size
        return index if self._refcount[state.block_table[index]] > 1 else None

    def _new_blocks_for(self, state: SequenceState, count: int) -> int:
        # Chapter 4's count, plus one if the first token lands in a shared, partly filled
        # block. (Written out rather than calling super(): it runs for every sequence of
        # every step.)
        bs, position = self.block_size, state.length + state.reserved
        needed = ceil_div(position + count, bs) - len(state.block_table)
        shared = position % bs and self._refcount[state.block_table[position // bs]] > 1
        if count and shared:
            return (needed if needed > 0 else 0) + 1
        return needed if needed > 0 else 0

    def _grow(self, state: SequenceState, k: int, undo: list[tuple],
              copies: list) -> list[int]:
        taken: list[int] = []
        index = self._shared_partial_block(state, state.length)
        if index is not None:
            src = state.block_table[index]
            (dst,) = self._take_blocks(1, state.seq_id)               # logged: alloc dst
            state.block_table[index] = dst
            self._refcount[src] -= 1
            self._log("cow", state.seq_id, src, f"copied to block {dst}")
            copies.append((src, dst))
            undo.append(("cow", state, index, src, dst))
            taken.append(dst)
        # Recount: an earlier sequence of this step may have copied away from a block.
        tokens = state.length + state.reserved
        missing = ceil_div(tokens, self.block_size) - len(state.block_table)
        if missing > 0:
            taken += super()._grow(state, missing, undo, copies)
        return taken

    def _undo(self, entry: tuple) -> None:
        if entry[0] != "cow":
            super()._undo(entry)
            return
        _, state, index, src, dst = entry
        state.block_table[index] = src
        self._refcount[src] += 1
        self._log("ref", state.seq_id, src, f"copy to block {dst} undone")
        self._untake_block(dst)

    # %% chapters/05_sharing.md § Sentinels through the copies
    def block_owners(self) -> dict[int, list[Hashable]]:
        """GPU block -> the sequences whose tables hold it (only allocated blocks)."""
        owners: dict[int, list[Hashable]] = {}
        for seq_id, state in self._seqs.items():
            for block in state.block_table:
                owners.setdefault(block, []).append(seq_id)
        return owners

    def internal_fragmentation_tokens(self) -> int:
        """Empty slots in allocated blocks; a shared block counts once, as full as its
        fullest sharer."""
        bs, filled = self.block_size, {}
        for state in self._seqs.values():
            tokens = state.length + state.reserved
            for j, block in enumerate(state.block_table):
                filled[block] = max(filled.get(block, 0), min(bs, tokens - j * bs))
        return sum(bs - f for f in filled.values())

    # %% chapters/05_sharing.md § Swapping at block granularity
    def _state(self, seq_id: Hashable) -> SequenceState:
        if seq_id in self._swapped:
            hint = ("it is swapped out to the CPU pool: swap_in() it first, "
                    + "or release_swapped() it")
            raise UnknownSequenceError(seq_id, hint)
        return super()._state(seq_id)

    def create_sequence(self, seq_id: Hashable) -> None:
        if seq_id in self._swapped:
            raise SequenceExistsError(seq_id)
        super().create_sequence(seq_id)

    @property
    def num_free_cpu_blocks(self) -> int:
        """Blocks of the CPU pool not holding a swapped-out sequence."""
        return len(self._cpu_free)

    def swapped_ids(self) -> list[Hashable]:
        """The sequences now parked in the CPU pool, in the order they were swapped out."""
        return list(self._swapped)

    def is_swapped(self, seq_id: Hashable) -> bool:
        """Whether ``seq_id`` is parked in the CPU pool (not usable until ``swap_in``)."""
        return seq_id in self._swapped

    # %% chapters/05_sharing.md § Swapping at block granularity
    def swap_out(self, seq_id: Hashable) -> list[tuple[int, int]]:
        """Move a sequence's blocks to the CPU pool. Returns (gpu_block, cpu_block) copies,
        which the cache must run before any of those GPU blocks is written again (before the
        next step)."""
        self._check_no_step(f"swap out {seq_id!r}")
        state = self._state(seq_id)
        n = len(state.block_table)
        if n > len(self._cpu_free):
            raise NoFreeBlocksError(n, len(self._cpu_free),
                                    f"swapping out {seq_id!r} (CPU pool)")
        cpu_blocks = [self._cpu_free.pop() for _ in range(n)]
        pairs = list(zip(state.block_table, cpu_blocks))
        for gpu_block, cpu_block in pairs:
            self._log("swap_out", seq_id, gpu_block, f"to CPU block {cpu_block}")
        for block in reversed(state.block_table):
            self._drop_block(block, seq_id)
        del self._seqs[seq_id]
        self._swapped[seq_id] = SequenceState(seq_id, state.length, cpu_blocks)
        return pairs

    def swap_in(self, seq_id: Hashable) -> list[tuple[int, int]]:
        """Bring a swapped-out sequence back into fresh GPU blocks. Returns (cpu_block,
        gpu_block) copies to run before the sequence's next step."""
        self._check_no_step(f"swap in {seq_id!r}")
        if seq_id not in self._swapped:
            raise UnknownSequenceError(seq_id, "it is not swapped out")
        parked = self._swapped[seq_id]
        self._ensure_free(len(parked.block_table), f"swapping in {seq_id!r}")
        gpu_blocks = self._take_blocks(len(parked.block_table), seq_id)
        pairs = list(zip(parked.block_table, gpu_blocks))
        for cpu_block, gpu_block in pairs:
            self._log("swap_in", seq_id, gpu_block, f"from CPU block {cpu_block}")
        for cpu_block in reversed(parked.block_table):
            self._cpu_free.push(cpu_block)
        del self._swapped[seq_id]
        self._seqs[seq_id] = SequenceState(seq_id, parked.length, gpu_blocks)
        return pairs

    def release_swapped(self, seq_id: Hashable) -> None:
        """Forget a swapped-out sequence (finished or cancelled while parked); frees its CPU
        blocks."""
        self._check_no_step(f"release swapped sequence {seq_id!r}")
        if seq_id not in self._swapped:
            raise UnknownSequenceError(seq_id, "it is not swapped out")
        for cpu_block in reversed(self._swapped.pop(seq_id).block_table):
            self._cpu_free.push(cpu_block)
        self._released[seq_id] = None

    # %% chapters/05_sharing.md § The scheduler's seam, with sharing and a CPU pool
    def usage(self) -> KVUsage:
        return KVUsage(self.block_size, self.num_physical_blocks, len(self._free),
                       len(self._cpu_free))

    def end_step(self, reservation: StepReservation | None, ran: bool = True, *,
                 forks: Iterable[tuple[Hashable, Hashable]] = (),
                 sampled: Mapping[Hashable, int] | None = None) -> None:
        super().end_step(reservation, ran, sampled=sampled)
        for parent_id, child_id in forks:
            self.fork(parent_id, child_id)

    def move(self, seq_id: Hashable,
             to: Literal["cpu", "gpu"] | None) -> list[tuple[int, int]] | None:
        if to == "cpu":
            if len(self._state(seq_id).block_table) > len(self._cpu_free):
                return None
            return self.swap_out(seq_id)
        if to == "gpu":
            return self.swap_in(seq_id)
        if seq_id in self._swapped:
            self.release_swapped(seq_id)
            return []
        return super().move(seq_id, to)

    # %% chapters/05_sharing.md § Debugging aids
    def history(self, seq_id: Hashable) -> list[BlockEvent]:
        """The logged events of one sequence, oldest first."""
        return [e for e in self.events if e.seq_id == seq_id]

    @staticmethod
    def replay_events(events: Iterable[BlockEvent],
                      ) -> tuple[dict[int, int], dict[Hashable, list[int]]]:
        """Rebuild (refcount per block, table per sequence holding blocks) from a complete
        log. Raises ``ValueError`` at the first event whose recorded count disagrees."""
        counts: dict[int, int] = {}
        tables: dict[Hashable, list[int]] = {}
        for e in events:
            table = tables.setdefault(e.seq_id, [])
            if e.op == "alloc":
                counts[e.block] = 1
                table.append(e.block)
            elif e.op in ("ref", "hit"):
                counts[e.block] = counts.get(e.block, 0) + 1
                table.append(e.block)
            elif e.op == "unref":
                counts[e.block] -= 1
                table.remove(e.block)
            elif e.op == "cow":          # the block allocated just before takes its place
                counts[e.block] -= 1
                copy = table.pop()
                table[table.index(e.block)] = copy
            elif e.op == "untake":       # an aborted step's fresh block: one table has it
                counts[e.block] = 0
                next(t for t in tables.values() if e.block in t).remove(e.block)
            if counts.get(e.block, e.refcount) != e.refcount:
                raise ValueError(f"event {e.index} ({e.op} block {e.block}) records "
                                 + f"refcount {e.refcount}, replayed {counts[e.block]}")
        return counts, {s: t for s, t in tables.items() if t}

    def log_inconsistency(self) -> str | None:
        """Replay the event log from an empty pool; name the first count or table that
        differs from the manager's (None: the log accounts for everything)."""
        if self._num_events and (not self.events or self.events[0].index != 1):
            return "the event log is incomplete: give the manager a larger event_log_size"
        try:
            counts, tables = self.replay_events(self.events)
        except (ValueError, KeyError, StopIteration) as error:
            return f"the log contradicts itself: {error!r}"
        for block in range(self.num_physical_blocks):
            if counts.get(block, 0) != self._refcount[block]:
                return (f"block {block}: refcount {self._refcount[block]}, "
                        + f"the log says {counts.get(block, 0)}")
        live = {s: list(st.block_table) for s, st in self._seqs.items() if st.block_table}
        for seq_id in {**tables, **live}:
            if tables.get(seq_id) != live.get(seq_id):
                return (f"sequence {seq_id!r}: table {live.get(seq_id)}, "
                        + f"the log says {tables.get(seq_id)}")
        return None

    # %% chapters/05_sharing.md § Making it fast
    def _new_blocks_for_step(self, states: list[SequenceState],
                             counts: list[int]) -> list[int]:
        """``_new_blocks_for`` of every sequence of a step, counted at once from the table
        array."""
        if len(states) < self._BATCH_COUNT_MIN:
            return super()._new_blocks_for_step(states, counts)
        bs, mirror = self.block_size, self._seqs.mirror
        rows = self._seqs.rows(states)
        position = np.fromiter([st.length + st.reserved for st in states], dtype=np.int64,
                               count=len(states))
        count = np.asarray(counts, dtype=np.int64)
        needed = (position + count + (bs - 1)) // bs - mirror.lengths[rows]
        np.maximum(needed, 0, out=needed)
        # Copy-on-write: one more where the first new token lands in a shared, partial
        # block.
        partial = np.flatnonzero((count > 0) & (position % bs != 0))
        if partial.size:
            blocks = mirror.array[rows[partial], position[partial] // bs].tolist()
            refs = np.fromiter(map(self._refcount.__getitem__, blocks), dtype=np.int64,
                               count=len(blocks))
            needed[partial[refs > 1]] += 1
        return needed.tolist()


# %% chapters/05_sharing.md § How much does sharing save?
def _replay(make_manager: Callable[[], SharingBlockManager], requests: Sequence,
            step_fn: Callable[[SharingBlockManager, object], Iterable[list[int]]],
            ) -> float:
    """Blocks saved over blocks held without sharing, summed over every step ``step_fn``
    yields.

    Each request starts as sequence 0 holding its prompt in a fresh manager; ``step_fn``
    forks, grows and releases sequences and yields the live ones after each decode step.
    """
    saved = total = 0
    for req in requests:
        manager = make_manager()
        manager.create_sequence(0)
        manager.append_tokens(0, max(1, req.prompt_len))
        for beams in step_fn(manager, req):
            unshared = sum(len(manager.block_table(s)) for s in beams)
            used = manager.num_physical_blocks - manager.num_free_blocks
            saved += unshared - used
            total += unshared
    return saved / total if total else 0.0


def parallel_sampling_savings(requests: Sequence, n: int,
                              block_size: int = 16) -> float:
    """Share of KV blocks saved by sharing the prompt among ``n`` samples, over all
    decode steps.

    ``requests`` need ``prompt_len`` and ``output_len`` (e.g.
    ``minipaged.book.fragmentation`` traces).
    """
    def steps(manager: SharingBlockManager, req) -> Iterable[list[int]]:
        for child in range(1, n):
            manager.fork(0, child)
        for _ in range(req.output_len):
            manager.commit_step(manager.reserve_step(range(n)))
            yield list(range(n))

    longest = max((r.prompt_len + r.output_len for r in requests), default=1)
    pool = n * (ceil_div(longest, block_size) + 1)
    return _replay(lambda: SharingBlockManager(pool, block_size, event_log_size=0),
                   requests, steps)


# %% chapters/05_sharing.md § How much does sharing save?
def beam_search_savings(requests: Sequence, width: int, block_size: int = 16,
                        alpha: float = 1.0, seed: int = 0) -> float:
    """Share of KV blocks saved by sharing among ``width`` beams, over all decode steps.

    Each step, every new beam picks a parent with probability proportional to
    1/(rank+1)**alpha.
    """
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, width + 1) ** alpha
    weights /= weights.sum()

    def steps(manager: SharingBlockManager, req) -> Iterable[list[int]]:
        beams, next_id = [0], 1
        for _ in range(1, width):
            manager.fork(0, next_id)
            beams.append(next_id)
            next_id += 1
        for _ in range(req.output_len):
            parents = rng.choice(width, size=width, p=weights)
            children = np.bincount(parents, minlength=width)
            survivors = []
            for beam, count in zip(beams, children):
                if count == 0:
                    manager.release_sequence(beam)
            for beam, count in zip(beams, children):
                if count:
                    survivors.append(beam)
                    for _ in range(count - 1):
                        manager.fork(beam, next_id)
                        survivors.append(next_id)
                        next_id += 1
            beams = survivors
            manager.commit_step(manager.reserve_step(beams))
            yield beams

    longest = max((r.prompt_len + r.output_len for r in requests), default=1)
    pool = width * (ceil_div(longest, block_size) + 2)
    return _replay(lambda: SharingBlockManager(pool, block_size, event_log_size=0),
                   requests, steps)
