# GENERATED from chapters/04_block_manager.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/04_block_manager.md § A teaching manager
"""The block manager: a free list, block tables, slot mapping, atomic step reservation.

``TeachingBlockManager`` is the smallest manager that works; ``KVBlockManager`` is the
one the rest of the package builds on (chapter 5: sharing, chapter 6: prefix caching).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import numpy as np
import torch

from minipaged.memory.block_table import pad_block_tables
from minipaged.memory.sizing import ceil_div

__all__ = [
    "BlockManagerError",
    "NoFreeBlocksError",
    "UnknownSequenceError",
    "DoubleReleaseError",
    "SequenceExistsError",
    "StepPendingError",
    "TeachingBlockManager",
    "SequenceState",
    "FreeBlockList",
    "StepReservation",
    "compute_slot_mapping",
    "BlockTableArray",
    "BlockTable",
    "LiveSequences",
    "KVBlockManager",
    "KVUsage",
    "CachedPrefix",
    "NO_CACHED_PREFIX",
]


class BlockManagerError(Exception):
    """Base class of every error the block managers raise."""


class NoFreeBlocksError(BlockManagerError, MemoryError):
    """Not enough free blocks for an operation; the manager was left as it was."""

    def __init__(self, needed: int, available: int,
                 what: str = "this operation") -> None:
        self.needed, self.available = needed, available
        super().__init__(
            f"{what} needs {needed} free KV block(s) but only {available} are free; "
            "nothing was changed. Release or preempt a sequence, or retry with fewer "
            "tokens.")


# %% chapters/04_block_manager.md § A teaching manager
class TeachingBlockManager:
    """The smallest working block manager: a free list, a table and a length per
    request.

    ``append(request)`` places the request's next token and returns its slot
    (``physical_block * block_size + offset``); ``free(request)`` returns its blocks.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        # pop() gives block 0 first
        self.free_list: list[int] = list(range(num_blocks - 1, -1, -1))
        self.tables: dict[Hashable, list[int]] = {}
        self.lengths: dict[Hashable, int] = {}

    def append(self, request: Hashable) -> int:
        length = self.lengths.get(request, 0)
        table = self.tables.get(request, [])
        if length == len(table) * self.block_size:  # no block yet, or the last is full
            if not self.free_list:
                raise NoFreeBlocksError(1, 0, f"token {length} of request {request!r}")
            table = table + [self.free_list.pop()]
        self.tables[request] = table
        self.lengths[request] = length + 1
        return table[-1] * self.block_size + length % self.block_size

    def free(self, request: Hashable) -> None:
        self.free_list.extend(reversed(self.tables.pop(request)))
        del self.lengths[request]


# %% chapters/04_block_manager.md § The real manager: state, create, release, invariants
class UnknownSequenceError(BlockManagerError, KeyError):
    """An operation named a sequence the manager does not hold."""

    def __init__(self, seq_id: Hashable,
                 hint: str = "create_sequence() it first") -> None:
        self.seq_id = seq_id
        super().__init__(f"no live sequence {seq_id!r}: {hint}")

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class DoubleReleaseError(UnknownSequenceError):
    """A sequence was released twice: the second release would free its blocks again."""

    def __init__(self, seq_id: Hashable) -> None:
        super().__init__(seq_id, "it was already released (a second release would "
                                 "free its blocks twice); release each sequence "
                                 "exactly once")


class SequenceExistsError(BlockManagerError, ValueError):
    """``create_sequence`` (or ``fork``) was given an id that is already live."""

    def __init__(self, seq_id: Hashable) -> None:
        self.seq_id = seq_id
        super().__init__(
            f"sequence {seq_id!r} already exists: pick a fresh id or release it first")


class StepPendingError(BlockManagerError, RuntimeError):
    """A step is reserved but neither committed nor aborted, and the call would change
    its blocks."""

    def __init__(self, what: str) -> None:
        super().__init__(
            f"cannot {what} while a step is reserved: "
            "commit_step() or abort_step() first")


# %% chapters/04_block_manager.md § The real manager: state, create, release, invariants
@dataclass
class SequenceState:
    """One sequence's bookkeeping: tokens in the cache, block table, tokens reserved."""

    seq_id: Hashable
    length: int = 0
    block_table: list[int] = field(default_factory=list)
    reserved: int = 0

    def blocks_for(self, num_tokens: int, block_size: int) -> int:
        """Table entries needed to hold ``num_tokens`` tokens."""
        return ceil_div(num_tokens, block_size)


class FreeBlockList:
    """Free physical blocks in a FIFO queue: ``pop`` the oldest-freed block, ``push`` to
    the back."""

    def __init__(self, blocks: Iterable[int]) -> None:
        self._queue: deque[int] = deque(blocks)

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[int]:
        return iter(self._queue)

    def pop(self) -> int:
        return self._queue.popleft()

    def push(self, block: int) -> None:
        self._queue.append(block)

    def unpop(self, block: int) -> None:
        """Put a block back at the front, undoing a ``pop``."""
        self._queue.appendleft(block)


# %% chapters/04_block_manager.md § The real manager: state, create, release, invariants
class KVBlockManager:
    """Owns ``num_physical_blocks`` KV blocks of ``block_size`` tokens and every table.

    A model step is ``reserve_step`` (all blocks of the batch, or none) -> run the
    model with the returned slot mapping -> ``commit_step`` (lengths advance) or
    ``abort_step`` (nothing happened). ``append_token`` is a one-token step reserved and
    committed at once.
    """

    _RELEASED_MEMORY = 1 << 16  # released ids remembered, to report double releases

    def __init__(self, num_physical_blocks: int, block_size: int) -> None:
        for name, value in (("num_physical_blocks", num_physical_blocks),
                            ("block_size", block_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.num_physical_blocks = num_physical_blocks
        self.block_size = block_size
        self._free = self._make_free_list(range(num_physical_blocks))
        self._seqs = self._make_live_sequences()  # seq_id -> SequenceState
        self._released: OrderedDict[Hashable, None] = OrderedDict()
        self._pending: StepReservation | None = None
        self._next_step = 0

    def __contains__(self, seq_id: Hashable) -> bool:
        return seq_id in self._seqs

    # -- hooks a subclass replaces (chapter 5: refcounts, chapter 6: cached blocks)
    def _make_free_list(self, blocks: Iterable[int]) -> FreeBlockList:
        return FreeBlockList(blocks)

    def _take_blocks(self, n: int, seq_id: Hashable) -> list[int]:
        """Take n blocks for ``seq_id`` (the caller checked that there are enough)."""
        return [self._free.pop() for _ in range(n)]

    def _drop_block(self, block: int, seq_id: Hashable) -> None:
        """The table of ``seq_id`` stops referencing ``block``."""
        self._free.push(block)

    def _untake_block(self, block: int) -> None:
        """Undo ``_take_blocks`` for one block (blocks come back in reverse order)."""
        self._free.unpop(block)

    # %% chapters/04_block_manager.md § The real manager: state, create, release, invariants
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_sequences(self) -> int:
        return len(self._seqs)

    def seq_ids(self) -> list[Hashable]:
        return list(self._seqs)

    def _state(self, seq_id: Hashable) -> SequenceState:
        try:
            return self._seqs[seq_id]
        except KeyError:
            if seq_id in self._released:
                raise DoubleReleaseError(seq_id) from None
            raise UnknownSequenceError(seq_id) from None

    def block_table(self, seq_id: Hashable) -> list[int]:
        """A copy of the sequence's block table (logical block j -> physical block)."""
        return list(self._state(seq_id).block_table)

    def sequence_length(self, seq_id: Hashable) -> int:
        """Tokens of the sequence whose KV is in the cache (committed steps only)."""
        return self._state(seq_id).length

    # %% chapters/04_block_manager.md § The real manager: state, create, release, invariants
    def _check_no_step(self, what: str) -> None:
        if self._pending is not None:
            raise StepPendingError(what)

    def create_sequence(self, seq_id: Hashable) -> None:
        """Start an empty sequence; blocks come with its first tokens."""
        self._check_no_step(f"create sequence {seq_id!r}")
        if seq_id in self._seqs:
            raise SequenceExistsError(seq_id)
        self._seqs[seq_id] = SequenceState(seq_id)
        self._released.pop(seq_id, None)

    def release_sequence(self, seq_id: Hashable) -> None:
        """Return the sequence's blocks (last block first) and forget it."""
        self._check_no_step(f"release sequence {seq_id!r}")
        state = self._state(seq_id)
        for block in reversed(state.block_table):
            self._drop_block(block, seq_id)
        del self._seqs[seq_id]
        self._released[seq_id] = None
        if len(self._released) > self._RELEASED_MEMORY:
            self._released.popitem(last=False)

    # %% chapters/04_block_manager.md § The real manager: state, create, release, invariants
    def first_inconsistency(self) -> str | None:
        """None if every invariant holds, else a sentence naming the first bad block."""
        free = list(self._free)
        owner: dict[int, Hashable] = {}
        for seq_id, st in self._seqs.items():
            n = len(st.block_table)
            if n != st.blocks_for(st.length + st.reserved, self.block_size):
                tokens = f"{st.length}+{st.reserved} tokens at block size {self.block_size}"
                return f"sequence {seq_id!r}: {n} table entries for {tokens}"
            for block in st.block_table:
                if not 0 <= block < self.num_physical_blocks:
                    return f"block {block} of sequence {seq_id!r} is outside the pool"
                if block in owner:
                    both = f"{owner[block]!r} and {seq_id!r}"
                    return f"block {block} is in the tables of both {both}"
                owner[block] = seq_id
        seen: set[int] = set()
        for block in free:
            if block in seen:
                return f"block {block} is twice in the free list"
            if block in owner:
                return f"block {block} is free but in the table of {owner[block]!r}"
            seen.add(block)
        if len(seen) + len(owner) != self.num_physical_blocks:
            lost = sorted(set(range(self.num_physical_blocks)) - seen - set(owner))
            count = f"(lost: {len(lost)} block(s))"
            return f"block {lost[0]} is neither free nor in any table {count}"
        return self._storage_inconsistency()

    def invariants_ok(self) -> bool:
        """Free and allocated are disjoint, together are the whole pool, no block in two
        tables, every table has exactly the entries its length needs, and the tables'
        storage is right."""
        return self.first_inconsistency() is None and self._storage_inconsistency() is None

    # %% chapters/04_block_manager.md § Where a token goes: append_token and its slot
    def _new_blocks_for(self, state: SequenceState, count: int) -> int:
        """Free blocks that writing ``count`` more tokens into ``state`` takes."""
        tokens = state.length + state.reserved + count
        needed = ceil_div(tokens, self.block_size) - len(state.block_table)
        return needed if needed > 0 else 0

    def num_blocks_to_allocate(self, num_new_tokens: Mapping[Hashable, int]) -> int:
        """Free blocks a step writing ``num_new_tokens[seq]`` tokens per sequence takes."""
        counts = num_new_tokens.items()
        return sum(self._new_blocks_for(self._state(s), n) for s, n in counts)

    def _ensure_free(self, total: int, what: str) -> None:
        if total > self.num_free_blocks:
            raise NoFreeBlocksError(total, self.num_free_blocks, what)

    def internal_fragmentation_tokens(self) -> int:
        """Slots in allocated blocks that hold no token (at most block_size - 1 each)."""
        return sum(len(st.block_table) * self.block_size - st.length - st.reserved
                   for st in self._seqs.values())

    # %% chapters/04_block_manager.md § A step, all or nothing: reserve, commit, abort
    def reserve_step(self, num_new_tokens: Mapping[Hashable, int] | Iterable[Hashable]
                     ) -> StepReservation:
        """Take every block a step needs, or raise ``NoFreeBlocksError`` and change nothing.

        ``num_new_tokens`` maps each sequence of the batch to the tokens it writes this step
        (a plain iterable of ids means one token each: a decode step).
        """
        self._check_no_step("reserve another step")
        if not isinstance(num_new_tokens, Mapping):
            ids = list(num_new_tokens)
            num_new_tokens = dict.fromkeys(ids, 1)
            if len(num_new_tokens) != len(ids):
                raise ValueError("a step lists a sequence twice; give each sequence once")
        try:
            states = [self._seqs[s] for s in num_new_tokens]
        except KeyError:
            states = [self._state(s) for s in num_new_tokens]  # raises the precise error
        counts = list(num_new_tokens.values())
        if counts and min(counts) < 0:
            raise ValueError(f"token counts must be >= 0, got {dict(num_new_tokens)}")
        needed = self._new_blocks_for_step(states, counts)
        self._ensure_free(sum(needed), f"a step of {len(states)} sequence(s)")
        undo: list[tuple] = []
        copies: list[tuple[int, int]] = []
        new_blocks: dict[Hashable, list[int]] = {}
        try:
            for state, n, k in zip(states, counts, needed):
                state.reserved = n
                if k:
                    new_blocks[state.seq_id] = self._grow(state, k, undo, copies)
            seq_ids = tuple(num_new_tokens)
            reservation = self._describe_step(states, counts, new_blocks, seq_ids)
        except BaseException:  # whatever failed half-way (a bug, an interrupt): roll back
            self._roll_back(undo, states)
            raise
        reservation.copies, reservation.undo = copies, undo
        self._next_step += 1
        self._pending = reservation
        return reservation

    def _new_blocks_for_step(self, states: list[SequenceState],
                             counts: list[int]) -> list[int]:
        """``_new_blocks_for`` of each sequence of a step (a subclass may count at once)."""
        new_blocks_for = self._new_blocks_for
        return [new_blocks_for(st, n) for st, n in zip(states, counts)]

    # %% chapters/04_block_manager.md § A step, all or nothing: reserve, commit, abort
    def _grow(self, state: SequenceState, k: int, undo: list[tuple],
              copies: list) -> list[int]:
        """Append ``k`` fresh blocks to the table; log ``("grow", state, blocks)``."""
        blocks = self._take_blocks(k, state.seq_id)
        state.block_table.extend(blocks)
        undo.append(("grow", state, blocks))
        return blocks

    def _undo(self, entry: tuple) -> None:
        """Reverse one logged change of a reservation (subclasses add their own kinds)."""
        kind, state, blocks = entry
        if kind != "grow":
            raise BlockManagerError(f"cannot undo a {kind!r} change")
        del state.block_table[-len(blocks):]
        for block in reversed(blocks):
            self._untake_block(block)

    def _roll_back(self, undo: list[tuple], states: Iterable[SequenceState]) -> None:
        for entry in reversed(undo):
            self._undo(entry)
        for state in states:
            state.reserved = 0

    # %% chapters/04_block_manager.md § A step, all or nothing: reserve, commit, abort
    def _check_pending(self, reservation: StepReservation) -> None:
        if self._pending is None or reservation.step_id != self._pending.step_id:
            pending = "none" if self._pending is None else self._pending.step_id
            wrong = f"step {reservation.step_id} is not the reserved step ({pending})"
            rule = ": commit or abort each reservation exactly once"
            raise BlockManagerError(wrong + rule)

    def commit_step(self, reservation: StepReservation) -> None:
        """The model wrote the step's tokens: advance every sequence's length."""
        self._check_pending(reservation)
        for state in reservation.states:
            state.length += state.reserved
            state.reserved = 0
        self._pending = None

    def abort_step(self, reservation: StepReservation) -> None:
        """The step did not run: undo it; the manager is as before ``reserve_step``."""
        self._check_pending(reservation)
        self._roll_back(reservation.undo, reservation.states)
        self._pending = None

    @property
    def pending_step(self) -> StepReservation | None:
        return self._pending

    def can_reserve(self, num_new_tokens: Mapping[Hashable, int]) -> bool:
        return self.num_blocks_to_allocate(num_new_tokens) <= self.num_free_blocks

    def append_token(self, seq_id: Hashable) -> int:
        """Place one token (a one-sequence, one-token step) and return its slot."""
        reservation = self.reserve_step({seq_id: 1})
        self.commit_step(reservation)
        return int(reservation.slot_mapping[0])

    def append_tokens(self, seq_id: Hashable, num_tokens: int) -> list[int]:
        """Place ``num_tokens`` tokens at once (a prefill); all get blocks or none do."""
        reservation = self.reserve_step({seq_id: num_tokens})
        self.commit_step(reservation)
        return reservation.slot_mapping.tolist()

    # %% chapters/04_block_manager.md § Batch tensors for the kernels
    def get_seq_lens_tensor(self, seq_ids: Sequence[Hashable],
                            device: torch.device | str | None = None) -> torch.Tensor:
        """int32 [len(seq_ids)]: tokens attention reads, with the pending step's."""
        states = [self._state(s) for s in seq_ids]
        lens = torch.tensor([st.length + st.reserved for st in states], dtype=torch.int32)
        return lens.to(device) if device is not None else lens

    # %% chapters/04_block_manager.md § The manager on the table array
    def _make_live_sequences(self) -> LiveSequences:
        """The live sequences, their block tables mirrored in one persistent array."""
        return LiveSequences(BlockTableArray())

    def _storage_inconsistency(self) -> str | None:
        """None if the table array mirrors every live table exactly, else what differs."""
        return self._seqs.mirror_inconsistency()

    def get_block_table_tensor(self, seq_ids: Sequence[Hashable], pad_value: int = 0,
                               device: torch.device | str | None = None) -> torch.Tensor:
        """int32 [len(seq_ids), longest table], rows padded with ``pad_value``.

        One gather from the mirrored table array, whatever the tables' lengths; the tensor
        is a copy. Kernels read a row only up to the sequence's length.
        """
        try:
            states = [self._seqs[s] for s in seq_ids]
        except KeyError:
            states = [self._state(s) for s in seq_ids]  # raises the precise error
        out = torch.from_numpy(self._seqs.mirror.gather(self._seqs.rows(states), pad_value))
        return out.to(device) if device is not None else out

    # %% chapters/04_block_manager.md § The manager on the table array
    def _describe_step(self, states: list[SequenceState], counts: list[int],
                       new_blocks: dict[Hashable, list[int]],
                       seq_ids: tuple[Hashable, ...] | None = None) -> StepReservation:
        """The step's slots, positions and lengths: one gather from the table array."""
        bs, mirror = self.block_size, self._seqs.mirror
        rows = self._seqs.rows(states)
        starts = np.fromiter([st.length for st in states], dtype=np.int64,
                             count=len(states))
        counts_np = np.asarray(counts, dtype=np.int64)
        if (counts_np == 1).all():  # a decode step: one token per row
            positions, token_rows = starts, rows
        else:
            row = np.repeat(np.arange(len(counts)), counts_np)
            first = (np.cumsum(counts_np) - counts_np)[row]  # first token of its sequence
            positions = starts[row] + np.arange(len(row)) - first
            token_rows = rows[row]
        blocks = mirror.array[token_rows, positions // bs].astype(np.int64)
        return StepReservation(
            step_id=self._next_step,
            seq_ids=seq_ids if seq_ids is not None else tuple(st.seq_id for st in states),
            num_new_tokens=tuple(counts),
            slot_mapping=torch.from_numpy(blocks * bs + positions % bs),
            positions=torch.from_numpy(positions),
            seq_lens=torch.from_numpy((starts + counts_np).astype(np.int32)),
            block_tables=torch.from_numpy(mirror.gather(rows)),
            new_blocks=new_blocks, states=states)

    # %% chapters/04_block_manager.md § The scheduler's seam
    def usage(self) -> KVUsage:
        """Block size, pool size and free blocks, read together."""
        return KVUsage(self.block_size, self.num_physical_blocks, len(self._free))

    def find_cached_prefix(self, token_ids: Sequence[int]) -> CachedPrefix:
        """The cached blocks ``token_ids`` could start from: none, this manager caches nothing."""
        return NO_CACHED_PREFIX

    def allocate_prompt(self, seq_id: Hashable, token_ids: Sequence[int],
                        prefix: CachedPrefix | None = None) -> int:
        """Admit a prompt: create ``seq_id`` on ``prefix``'s blocks and return the tokens
        already computed (0 here). The other tokens get their blocks in the next step."""
        if prefix is not None and prefix.blocks:
            raise BlockManagerError("this manager caches no prefix: it cannot attach one")
        self.create_sequence(seq_id)
        return 0

    # %% chapters/04_block_manager.md § The scheduler's seam
    def end_step(self, reservation: StepReservation | None, ran: bool = True, *,
                 forks: Iterable[tuple[Hashable, Hashable]] = (),
                 sampled: Mapping[Hashable, int] | None = None) -> None:
        """End a step: commit ``reservation`` if its forward ``ran``, else abort it (None: a
        step without blocks). Then each ``(parent, child)`` of ``forks`` shares the parent's
        blocks, and ``sampled`` (seq_id -> token) are the tokens the step sampled."""
        if reservation is not None:
            if ran:
                self.commit_step(reservation)
            else:
                self.abort_step(reservation)
        if forks:
            raise BlockManagerError("this manager shares no blocks: it cannot fork")

    def move(self, seq_id: Hashable,
             to: Literal["cpu", "gpu"] | None) -> list[tuple[int, int]] | None:
        """Move a sequence's KV: ``None`` frees its blocks, ``"cpu"`` parks them in the CPU
        pool, ``"gpu"`` brings them back. Returns the (src, dst) block copies to make, or
        None, changing nothing, when the CPU pool cannot take them (here: there is none)."""
        if to is None:
            self.release_sequence(seq_id)
            return []
        if to == "cpu":
            return None
        raise BlockManagerError(f"{seq_id!r} is not in a CPU pool (this manager has none)")

    def inconsistency_with(self, lengths: Mapping[Hashable, int]) -> str | None:
        """None if the manager holds exactly the sequences of ``lengths`` (seq_id -> tokens in
        the cache) at those lengths and its invariants hold; else what differs."""
        held = {seq_id: self.sequence_length(seq_id) for seq_id in self.seq_ids()}
        if held != dict(lengths):
            return f"the manager holds {held}, its caller expects {dict(lengths)}"
        return self.first_inconsistency()


# %% chapters/04_block_manager.md § A step, all or nothing: reserve, commit, abort
@dataclass
class StepReservation:
    """The blocks and slots of one reserved model step, held until commit or abort.

    ``slot_mapping`` and ``positions`` have one int64 entry per new token, sequence
    by sequence in ``seq_ids`` order; ``seq_lens`` (int32) is each sequence's length
    after the step and ``block_tables`` (int32, one row per sequence, padded with 0)
    its table after the step: with them a model can run the step. ``copies`` are
    (src, dst) block copies the cache must run before writing (chapter 5).
    """

    step_id: int
    seq_ids: tuple[Hashable, ...]
    num_new_tokens: tuple[int, ...]
    slot_mapping: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    new_blocks: dict[Hashable, list[int]]
    copies: list[tuple[int, int]] = field(default_factory=list)
    undo: list[tuple] = field(default_factory=list, repr=False)
    states: list[SequenceState] = field(default_factory=list, repr=False)

    @property
    def num_tokens(self) -> int:
        return int(sum(self.num_new_tokens))


# %% chapters/04_block_manager.md § Making it fast
class BlockTableArray:
    """Every live block table mirrored in one int32 array: row ``r`` holds one table.

    ``lengths[r]`` is the number of entries of row ``r`` (the rest is 0). Rows are
    handed out by ``attach`` and given back by ``detach``; the array grows (rows or
    width doubled) when a table does not fit.
    """

    def __init__(self, rows: int = 64, width: int = 32) -> None:
        self.array = np.zeros((rows, width), dtype=np.int32)
        self.lengths = np.zeros(rows, dtype=np.int64)
        # pop() gives row 0 first
        self._free_rows: list[int] = list(range(rows - 1, -1, -1))

    @property
    def num_rows(self) -> int:
        return self.array.shape[0]

    def _resize(self, rows: int, width: int) -> None:
        old_rows, old_width = self.array.shape
        array = np.zeros((rows, width), dtype=np.int32)
        array[:old_rows, :old_width] = self.array
        lengths = np.zeros(rows, dtype=np.int64)
        lengths[:old_rows] = self.lengths
        self.array, self.lengths = array, lengths
        self._free_rows[:0] = range(rows - 1, old_rows - 1, -1)

    def attach(self, blocks: Iterable[int]) -> "BlockTable":
        """A ``BlockTable`` holding ``blocks`` on a fresh row of the array."""
        table = BlockTable(blocks)
        if not self._free_rows:
            self._resize(2 * self.num_rows, self.array.shape[1])
        table._mirror, table._row = self, self._free_rows.pop()
        self.sync(table._row, table, 0)
        return table

    def detach(self, table: "BlockTable") -> None:
        """Give ``table``'s row back (zeroed); the table stays a plain list."""
        row = table._row
        self.array[row, :self.lengths[row]] = 0
        self.lengths[row] = 0
        self._free_rows.append(row)
        table._mirror = table._row = None

    # %% chapters/04_block_manager.md § Making it fast
    def sync(self, row: int, table: Sequence[int], start: int) -> None:
        """Row ``row`` := ``table``, rewriting entries from ``start`` on."""
        old, new = int(self.lengths[row]), len(table)
        if new > self.array.shape[1]:
            self._resize(self.num_rows, max(2 * self.array.shape[1], new))
        if new > start:
            self.array[row, start:new] = table[start:]
        if old > new:
            self.array[row, new:old] = 0
        self.lengths[row] = new

    def gather(self, rows: np.ndarray, pad_value: int = 0) -> np.ndarray:
        """The tables of ``rows``: a new int32 [len(rows), longest] array, padded."""
        lengths = self.lengths[rows]
        width = int(lengths.max()) if len(rows) else 0
        out = self.array[rows, :width]  # advanced indexing: a copy, never a view
        if pad_value != 0:
            out[np.arange(width) >= lengths[:, None]] = pad_value
        return out


# %% chapters/04_block_manager.md § Making it fast
class BlockTable(list):
    """A sequence's block table: a list of block ids that writes every change through to
    its row of a ``BlockTableArray`` while attached (``LiveSequences`` attaches it)."""

    __slots__ = ("_mirror", "_row")

    def __init__(self, blocks: Iterable[int] = ()) -> None:
        super().__init__(blocks)
        self._mirror: BlockTableArray | None = None
        self._row: int | None = None

    def _sync(self, start: int = 0) -> None:
        if self._mirror is not None:
            self._mirror.sync(self._row, self, start)

    def append(self, block: int) -> None:
        super().append(block)
        self._sync(len(self) - 1)

    def extend(self, blocks: Iterable[int]) -> None:
        start = len(self)
        super().extend(blocks)
        self._sync(start)

    def __iadd__(self, blocks: Iterable[int]) -> "BlockTable":
        self.extend(blocks)
        return self

    def __setitem__(self, index, value) -> None:
        super().__setitem__(index, value)
        self._sync(index % len(self) if isinstance(index, int) else 0)

    def __delitem__(self, index) -> None:
        start = 0
        if isinstance(index, slice) and (index.step or 1) > 0:
            start = index.indices(len(self))[0]
        elif isinstance(index, int):
            start = index % len(self) if self else 0
        super().__delitem__(index)
        self._sync(min(start, len(self)))

    def __imul__(self, times: int) -> "BlockTable":
        super().__imul__(times)
        self._sync(0)
        return self

    # %% chapters/04_block_manager.md § Making it fast
    def pop(self, index: int = -1) -> int:
        block = super().pop(index)
        self._sync(0)
        return block

    def insert(self, index: int, block: int) -> None:
        super().insert(index, block)
        self._sync(0)

    def remove(self, block: int) -> None:
        super().remove(block)
        self._sync(0)

    def clear(self) -> None:
        super().clear()
        self._sync(0)

    def sort(self, *, key=None, reverse: bool = False) -> None:
        super().sort(key=key, reverse=reverse)
        self._sync(0)

    def reverse(self) -> None:
        super().reverse()
        self._sync(0)


# %% chapters/04_block_manager.md § Making it fast
class LiveSequences(dict):
    """``seq_id -> SequenceState`` of the live sequences; every state placed in it gets
    its block table attached to a row of ``mirror``, and every state that leaves gives
    its row back."""

    def __init__(self, mirror: BlockTableArray) -> None:
        super().__init__()
        self.mirror = mirror

    def attach(self, state: SequenceState) -> None:
        """Make ``state.block_table`` a ``BlockTable`` on its own row of the mirror."""
        table = state.block_table
        if not (type(table) is BlockTable and table._mirror is self.mirror):
            state.block_table = self.mirror.attach(table)

    def _detach(self, state: SequenceState) -> None:
        table = state.block_table
        if type(table) is BlockTable and table._mirror is self.mirror:
            self.mirror.detach(table)

    def __setitem__(self, seq_id: Hashable, state: SequenceState) -> None:
        old = self.get(seq_id)
        if old is not None and old is not state:
            self._detach(old)
        self.attach(state)
        super().__setitem__(seq_id, state)

    def __delitem__(self, seq_id: Hashable) -> None:
        self._detach(self[seq_id])
        super().__delitem__(seq_id)

    def pop(self, seq_id: Hashable, *default):
        if seq_id in self:
            self._detach(self[seq_id])
        return super().pop(seq_id, *default)

    def popitem(self):
        seq_id, state = super().popitem()
        self._detach(state)
        return seq_id, state

    def clear(self) -> None:
        for state in self.values():
            self._detach(state)
        super().clear()

    def setdefault(self, seq_id: Hashable, state: SequenceState):
        if seq_id not in self:
            self[seq_id] = state
        return self[seq_id]

    def update(self, *args, **kwargs) -> None:
        for seq_id, state in dict(*args, **kwargs).items():
            self[seq_id] = state

    # %% chapters/04_block_manager.md § Making it fast
    def rows(self, states: Sequence[SequenceState]) -> np.ndarray:
        """The mirror rows of ``states`` (re-attaching a table replaced by a plain list)."""
        try:
            return np.array([st.block_table._row for st in states], dtype=np.intp)
        except (AttributeError, TypeError):
            for state in states:
                self.attach(state)
            return np.array([st.block_table._row for st in states], dtype=np.intp)

    def mirror_inconsistency(self) -> str | None:
        """None if the array mirrors every live table exactly (and nothing else), else what
        differs."""
        mirror, used = self.mirror, set()
        for seq_id, state in self.items():
            table = state.block_table
            if type(table) is not BlockTable or table._mirror is not mirror:
                what = "its block table is not attached to the table array"
                return f"sequence {seq_id!r}: {what}"
            if table._row in used:
                where = f"sequence {seq_id!r}: row {table._row} of the table array"
                return f"{where} is used twice"
            used.add(table._row)
            n, row = len(table), mirror.array[table._row]
            stored = int(mirror.lengths[table._row])
            if stored != n or row[:n].tolist() != list(table) or row[n:].any():
                where = f"sequence {seq_id!r}: row {table._row} of the table array"
                return f"{where} is {row[:max(n, stored)].tolist()}, table is {list(table)}"
        free = set(mirror._free_rows)
        if (len(free) != len(mirror._free_rows) or free & used
                or len(free) + len(used) != mirror.num_rows):
            return "the table array's free rows and used rows do not partition its rows"
        if mirror.array[sorted(free)].any():
            return "a free row of the table array is not zeroed"
        return None


# %% chapters/04_block_manager.md § The manager on the table array
def compute_slot_mapping(table_slices: Sequence[Sequence[int]],
                         first_blocks: Sequence[int],
                         starts: Sequence[int], counts: Sequence[int],
                         block_size: int) -> np.ndarray:
    """Slots of ``counts[i]`` new tokens from position ``starts[i]`` of each sequence.

    ``table_slices[i]`` is the part of sequence i's block table from logical block
    ``first_blocks[i]`` on that covers its new tokens. Returns int64 slots, sequence by
    sequence.
    """
    counts = np.asarray(counts, dtype=np.int64)
    starts = np.asarray(starts, dtype=np.int64)
    first_blocks = np.asarray(first_blocks, dtype=np.int64)
    slice_lengths = np.fromiter((len(s) for s in table_slices), dtype=np.int64,
                                count=len(table_slices))
    flat = np.fromiter((b for s in table_slices for b in s), dtype=np.int64,
                       count=int(slice_lengths.sum()))
    slice_base = np.cumsum(slice_lengths) - slice_lengths  # slice starts in `flat`
    row = np.repeat(np.arange(len(counts)), counts)        # each new token's sequence
    token_base = np.cumsum(counts) - counts
    positions = starts[row] + np.arange(int(counts.sum())) - token_base[row]
    blocks = flat[slice_base[row] + positions // block_size - first_blocks[row]]
    return blocks * block_size + positions % block_size


# %% chapters/04_block_manager.md § The scheduler's seam
class KVUsage(NamedTuple):
    """The numbers the scheduler reads from a manager, as one value."""

    block_size: int
    num_blocks: int
    num_free_blocks: int
    num_free_cpu_blocks: int = 0


class CachedPrefix(NamedTuple):
    """A prompt's longest cached prefix: its blocks in order, and how many of them sit in
    the free queue (attaching those takes them out of it)."""

    blocks: tuple[int, ...] = ()
    num_revived: int = 0


NO_CACHED_PREFIX = CachedPrefix()
"""The prefix a manager without a cache finds for every prompt."""
