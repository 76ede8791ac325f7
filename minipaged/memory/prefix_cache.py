# GENERATED from chapters/06_prefix_caching.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/06_prefix_caching.md § The free queue
"""Prefix caching: chained block hashes, verified hits, an LRU free queue, and the
engine-facing API."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from minipaged.memory.block_manager import CachedPrefix, SequenceState, StepReservation
from minipaged.memory.sharing import SharingBlockManager
from minipaged.memory.sizing import ceil_div

__all__ = ["LRUFreeBlockQueue", "chained_block_hash", "PrefixCacheStats",
           "PrefixCachingBlockManager"]


class LRUFreeBlockQueue:
    """Free blocks, least recently freed first, with O(1) removal of any block.

    ``pop`` takes the front; ``push`` appends at the back; ``push_front`` / ``unpop``
    put a block at the front (it is handed out first); ``remove`` takes a block out of
    the middle.
    """

    def __init__(self, blocks: Iterable[int]) -> None:
        self._queue: OrderedDict[int, None] = OrderedDict.fromkeys(blocks)

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[int]:
        return iter(self._queue)

    def __contains__(self, block: int) -> bool:
        return block in self._queue

    def pop(self) -> int:
        return self._queue.popitem(last=False)[0]

    def push(self, block: int) -> None:
        self._queue[block] = None

    def push_front(self, block: int) -> None:
        self._queue[block] = None
        self._queue.move_to_end(block, last=False)

    unpop = push_front

    def remove(self, block: int) -> None:
        del self._queue[block]


# %% chapters/06_prefix_caching.md § Hashing a chain of blocks
ROOT_HASH = 0x9E3779B97F4A7C15  # "no parent" (hash(None) varies per run before 3.12)


def chained_block_hash(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    """Hash of a full block from its parent's hash (None for the first block) and its
    token ids."""
    return hash((ROOT_HASH if parent_hash is None else parent_hash, token_ids))


@dataclass
class PrefixCacheStats:
    """Prompt tokens looked up, found in the cache, and blocks evicted to make room."""

    queries: int = 0
    hits: int = 0
    evictions: int = 0

    @property
    def hit_rate(self) -> float:
        """Share of looked-up prompt tokens found in the cache (0 before any lookup)."""
        return self.hits / self.queries if self.queries else 0.0


# %% chapters/06_prefix_caching.md § The manager
class PrefixCachingBlockManager(SharingBlockManager):
    """The engine-facing block manager: chapter 5's sharing manager plus automatic
    prefix caching.

    Admission: ``num_blocks_for_prompt(prompt)`` free blocks are needed to admit a
    prompt; ``allocate_prompt(seq_id, prompt)`` creates the sequence, attaches the
    longest verified cached prefix (never the last prompt token) and returns how many
    tokens are already computed. The rest of the prompt, and every decode token, goes
    through ``reserve_step`` / ``commit_step``; tell the manager each sampled token with
    ``append_token_ids`` so the blocks it fills can be cached.
    """

    def __init__(self, num_physical_blocks: int, block_size: int,
                 num_cpu_blocks: int = 0, *, enable_prefix_caching: bool = True,
                 hash_fn: Callable[[int | None, tuple], int] = chained_block_hash,
                 event_log_size: int = 4096) -> None:
        super().__init__(num_physical_blocks, block_size, num_cpu_blocks,
                         event_log_size)
        self.enable_prefix_caching = enable_prefix_caching
        self.hash_fn = hash_fn
        self.stats = PrefixCacheStats()
        n = num_physical_blocks
        self._generation = [0] * n
        self._block_hash: list[int | None] = [None] * n
        self._block_tokens: list[tuple[int, ...] | None] = [None] * n
        self._block_parent: list[tuple[int, int] | None] = [None] * n
        self._cache: dict[int, list[int]] = {}          # hash -> cached blocks with it
        self._tokens: dict[Hashable, list[int]] = {}    # known token ids per sequence
        self._chain: dict[Hashable, list[int]] = {}     # hashes of registered blocks
        self._lagging: set[Hashable] = set()            # full blocks of unknown tokens

    def _make_free_list(self, blocks: Iterable[int]) -> LRUFreeBlockQueue:
        return LRUFreeBlockQueue(blocks)

    # %% chapters/06_prefix_caching.md § The manager
    def create_sequence(self, seq_id: Hashable) -> None:
        super().create_sequence(seq_id)
        self._tokens[seq_id], self._chain[seq_id] = [], []

    def append_token_ids(self, seq_id: Hashable, token_ids: Iterable[int]) -> None:
        """Record token ids (Python ints) of a live or swapped sequence, in order."""
        try:
            self._tokens[seq_id].extend(token_ids)
        except KeyError:
            self._state(seq_id)  # raises the precise error
            raise

    def token_ids(self, seq_id: Hashable) -> list[int]:
        """The token ids the manager knows for a live or swapped sequence."""
        if seq_id not in self._tokens:
            self._state(seq_id)  # raises the precise error
        return list(self._tokens[seq_id])

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        super().fork(parent_id, child_id)
        self._tokens[child_id] = list(self._tokens[parent_id])
        self._chain[child_id] = list(self._chain[parent_id])
        if parent_id in self._lagging:
            self._lagging.add(child_id)

    def release_sequence(self, seq_id: Hashable) -> None:
        super().release_sequence(seq_id)
        del self._tokens[seq_id], self._chain[seq_id]
        self._lagging.discard(seq_id)

    def release_swapped(self, seq_id: Hashable) -> None:
        super().release_swapped(seq_id)
        del self._tokens[seq_id], self._chain[seq_id]
        self._lagging.discard(seq_id)

    def swap_in(self, seq_id: Hashable) -> list[tuple[int, int]]:
        pairs = super().swap_in(seq_id)
        self._chain[seq_id] = []      # fresh blocks: registered again at the next commit
        self._lagging.add(seq_id)
        return pairs

    # %% chapters/06_prefix_caching.md § Step 1: register full blocks when a step commits
    def _identity(self, block: int) -> tuple[int, int]:
        return block, self._generation[block]

    def _register(self, block: int, block_hash: int, tokens: tuple[int, ...],
                  parent: tuple[int, int] | None, seq_id: Hashable) -> None:
        self._block_hash[block], self._block_tokens[block] = block_hash, tokens
        self._block_parent[block] = parent
        self._cache.setdefault(block_hash, []).append(block)
        self._log("cache", seq_id, block, f"hash {block_hash & 0xFFFF:04x}")

    def commit_step(self, reservation: StepReservation) -> None:
        super().commit_step(reservation)
        if not self.enable_prefix_caching:
            return
        bs, lens = self.block_size, reservation.seq_lens.numpy()
        counts = np.asarray(reservation.num_new_tokens, dtype=lens.dtype)
        crossed = np.flatnonzero(lens // bs > (lens - counts) // bs).tolist()
        states = reservation.states
        for i in crossed:
            self._register_full_blocks(states[i])
        if self._lagging:
            for state in states:
                if state.seq_id in self._lagging:
                    self._register_full_blocks(state)

    def _register_full_blocks(self, state: SequenceState) -> None:
        bs, seq_id = self.block_size, state.seq_id
        chain, tokens = self._chain[seq_id], self._tokens[seq_id]
        full = min(state.length, len(tokens)) // bs
        for j in range(len(chain), full):
            block = state.block_table[j]
            block_tokens = tuple(tokens[j * bs:(j + 1) * bs])
            block_hash = self.hash_fn(chain[-1] if chain else None, block_tokens)
            if self._block_hash[block] is None:
                parent = self._identity(state.block_table[j - 1]) if j else None
                self._register(block, block_hash, block_tokens, parent, state.seq_id)
            elif (self._block_hash[block] != block_hash
                  or self._block_tokens[block] != block_tokens):
                break  # shared with a sequence that registered other tokens: stop the chain
            chain.append(block_hash)
        if len(chain) < state.length // bs and len(tokens) < state.length:
            self._lagging.add(state.seq_id)  # full blocks whose tokens are not told (yet)
        else:
            self._lagging.discard(state.seq_id)

    # %% chapters/06_prefix_caching.md § Step 1: register full blocks when a step commits
    def is_cached(self, block: int) -> bool:
        """Whether ``block`` holds a registered full block (in use or free, not evicted)."""
        return self._block_hash[block] is not None

    @property
    def num_cached_blocks(self) -> int:
        """Blocks registered in the cache, in use by some sequence or sitting free."""
        return sum(len(blocks) for blocks in self._cache.values())

    # %% chapters/06_prefix_caching.md § Step 2: look a prompt up
    def _match(self, token_ids: Sequence[int], max_blocks: int) -> list[int]:
        """Cached blocks holding the longest prefix of ``token_ids`` (at most
        ``max_blocks``)."""
        bs, block_hash = self.block_size, None
        levels: list[dict[tuple[int, int], tuple[int, tuple[int, int] | None]]] = []
        parents: Mapping = {None: None}
        for j in range(max_blocks):
            tokens = tuple(token_ids[j * bs:(j + 1) * bs])
            block_hash = self.hash_fn(block_hash, tokens)
            matches = {}
            for block in self._cache.get(block_hash, ()):
                parent = self._block_parent[block]
                if self._block_tokens[block] == tokens and parent in parents:
                    matches[self._identity(block)] = (block, parent)
            if not matches:
                break  # a miss, or only collisions (caught by comparing tokens and parent)
            levels.append(matches)
            parents = matches
        chain, identity = [], next(iter(levels[-1])) if levels else None
        for level in reversed(levels):
            block, identity = level[identity]
            chain.append(block)
        return chain[::-1]

    def _max_cached_blocks(self, num_prompt_tokens: int) -> int:
        if not self.enable_prefix_caching or num_prompt_tokens == 0:
            return 0
        return (num_prompt_tokens - 1) // self.block_size  # the last token is computed

    def match_prefix(self, prompt_token_ids: Sequence[int]) -> list[int]:
        """The cached blocks a call to ``allocate_prompt`` now would attach, in order."""
        return self._match(prompt_token_ids, self._max_cached_blocks(len(prompt_token_ids)))

    def cached_prefix_length(self, prompt_token_ids: Sequence[int]) -> int:
        """Tokens of the prompt that a call to ``allocate_prompt`` now would find cached."""
        return len(self.match_prefix(prompt_token_ids)) * self.block_size

    # %% chapters/06_prefix_caching.md § Step 3: admit a prompt onto its cached prefix
    def num_blocks_for_prompt(self, prompt_token_ids: Sequence[int],
                              hits: list[int] | None = None) -> int:
        """Free blocks admitting this prompt takes: its uncached blocks plus the cached ones
        that sit in the free queue (reviving them takes them out of it). ``hits``: the
        result of ``match_prefix`` for this prompt, if the caller has it."""
        hits = self.match_prefix(prompt_token_ids) if hits is None else hits
        revived = sum(1 for block in hits if self._refcount[block] == 0)
        return revived + (ceil_div(len(prompt_token_ids), self.block_size) - len(hits))

    def allocate_prompt(self, seq_id: Hashable, prompt_token_ids: Sequence[int],
                        hits: list[int] | CachedPrefix | None = None) -> int:
        """Create ``seq_id`` for this prompt and attach its longest cached prefix (``hits``,
        as ``match_prefix`` or ``find_cached_prefix`` returns it with no change to the
        manager since; looked up if None).

        Returns the number of prompt tokens already in the cache (a multiple of
        ``block_size``, below ``len(prompt)``): the sequence's length. Reserve the remaining
        prompt tokens in the next step. Takes no block that is not a verified cache hit, so
        it never runs out of memory.
        """
        self.create_sequence(seq_id)
        prompt = [int(t) for t in prompt_token_ids]
        hits = self.match_prefix(prompt) if hits is None else hits
        if isinstance(hits, CachedPrefix):
            hits = hits.blocks
        state = self._seqs[seq_id]
        for block in hits:
            if self._refcount[block] == 0:
                self._free.remove(block)
            self._refcount[block] += 1
            self._log("hit", seq_id, block)
        state.block_table.extend(hits)
        state.length = len(hits) * self.block_size
        self._tokens[seq_id] = prompt
        self._chain[seq_id] = [self._block_hash[b] for b in hits]
        self.stats.queries += len(prompt)
        self.stats.hits += state.length
        return state.length

    # %% chapters/06_prefix_caching.md § Step 4: keep freed blocks cached, evict lazily
    def _evict(self, block: int, seq_id: Hashable) -> None:
        candidates = self._cache[self._block_hash[block]]
        candidates.remove(block)
        if not candidates:
            del self._cache[self._block_hash[block]]
        self._block_hash[block] = self._block_tokens[block] = None
        self._block_parent[block] = None
        self.stats.evictions += 1
        self._log("evict", seq_id, block)

    def _take_blocks(self, n: int, seq_id: Hashable) -> list[int]:
        blocks = super()._take_blocks(n, seq_id)
        for block in blocks:
            if self._block_hash[block] is not None:
                self._evict(block, seq_id)
            self._generation[block] += 1
        return blocks

    def _drop_block(self, block: int, seq_id: Hashable) -> None:
        super()._drop_block(block, seq_id)
        if self._refcount[block] == 0 and self._block_hash[block] is None:
            self._free.push_front(block)  # nothing to keep: hand it out before cached ones

    # %% chapters/06_prefix_caching.md § The reconciliation, extended to the cache
    def first_inconsistency(self) -> str | None:
        problem = super().first_inconsistency()
        if problem:
            return problem
        listed: dict[int, int] = {}
        for block_hash, blocks in self._cache.items():
            for block in blocks:
                if self._block_hash[block] != block_hash:
                    return (f"block {block} is cached under hash {block_hash} but records "
                            + f"{self._block_hash[block]}")
                listed[block] = listed.get(block, 0) + 1
        for block in range(self.num_physical_blocks):
            if (self._block_hash[block] is not None) != (listed.get(block, 0) == 1):
                return (f"block {block}: hash {self._block_hash[block]} but listed "
                        + f"{listed.get(block, 0)} time(s) in the cache")
        for seq_id, state in self._seqs.items():
            for j, block_hash in enumerate(self._chain[seq_id]):
                if self._block_hash[state.block_table[j]] != block_hash:
                    return (f"block {state.block_table[j]} (block {j} of {seq_id!r}) "
                            + "lost its cache entry while in use")
        return None

    # %% chapters/06_prefix_caching.md § The engine-facing API
    def find_cached_prefix(self, token_ids: Sequence[int]) -> CachedPrefix:
        """The cached blocks ``allocate_prompt`` would attach now, and how many of them it
        takes out of the free queue."""
        hits = self.match_prefix(token_ids)
        refcount = self._refcount
        return CachedPrefix(tuple(hits), sum(1 for block in hits if refcount[block] == 0))

    def end_step(self, reservation: StepReservation | None, ran: bool = True, *,
                 forks: Iterable[tuple[Hashable, Hashable]] = (),
                 sampled: Mapping[Hashable, int] | None = None) -> None:
        """Chapter 4's ``end_step``; the sampled tokens are recorded after the forks, so a
        child does not inherit its parent's new token."""
        super().end_step(reservation, ran, forks=forks)
        if sampled:
            known = self._tokens
            for seq_id, token in sampled.items():
                if seq_id not in known:
                    self._state(seq_id)  # raises the precise error
                known[seq_id].append(token)
