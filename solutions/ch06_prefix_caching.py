"""Chapter 6 reference solutions."""

from collections.abc import Callable, Sequence

HashFn = Callable[[int | None, tuple[int, ...]], int]


def block_hashes(token_ids: Sequence[int], block_size: int, hash_fn: HashFn) -> list[int]:
    hashes: list[int] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        hashes.append(hash_fn(hashes[-1] if hashes else None, tuple(token_ids[start:start + block_size])))
    return hashes


def reusable_prefix_tokens(prompt: Sequence[int], cached_hashes: set[int], block_size: int,
                           hash_fn: HashFn) -> int:
    if not prompt:
        return 0
    limit = (len(prompt) - 1) // block_size
    reused = 0
    for h in block_hashes(prompt, block_size, hash_fn)[:limit]:
        if h not in cached_hashes:
            break
        reused += 1
    return reused * block_size


def blocks_taken(num_prompt_tokens: int, block_size: int, cached_blocks: int, unused_cached_blocks: int) -> int:
    return unused_cached_blocks + -(-num_prompt_tokens // block_size) - cached_blocks


def _prefill(m, seq, prompt) -> int:
    cached = m.allocate_prompt(seq, prompt)
    m.commit_step(m.reserve_step({seq: len(prompt) - cached}))
    return cached


def prefix_cache_checks(manager_cls) -> None:
    # Rule 1, only full blocks: 6 tokens at block size 4 leave one cached block; the second
    # is cached once decode tokens fill it (each told before the step that writes it).
    m = manager_cls(16, 4)
    _prefill(m, "a", list(range(6)))
    assert m.cached_prefix_length(list(range(10))) == 4
    for token in (6, 7):
        m.append_token_ids("a", [token])
        m.commit_step(m.reserve_step(["a"]))
    assert m.cached_prefix_length(list(range(10))) == 8
    m.release_sequence("a")
    # Rule 2, the last prompt token is computed: an exact repeat never finds all its tokens.
    _prefill(m, "b", list(range(8)))
    assert m.cached_prefix_length(list(range(8))) == 4
    assert _prefill(m, "c", list(range(8))) == 4
    assert m.cached_prefix_length(list(range(9))) == 8
    # Rule 3, verified hits: with a hash that always collides, only true prefixes match,
    # and a block matches only after the same parent.
    bad = manager_cls(32, 2, hash_fn=lambda parent, tokens: 0)
    _prefill(bad, "x", [1, 2, 3, 4, 5])
    _prefill(bad, "y", [9, 9, 6, 6, 5])
    assert bad.cached_prefix_length([1, 2, 3, 4, 5]) == 4
    assert bad.cached_prefix_length([1, 2, 9, 9, 5]) == 2
    assert bad.cached_prefix_length([9, 9, 3, 4, 5]) == 2     # (3, 4) only follows (1, 2)
    assert bad.cached_prefix_length([7, 7, 3, 4, 5]) == 0
    # Rule 4, freed blocks stay cached and are evicted lazily, least recently freed first.
    m = manager_cls(6, 4)
    _prefill(m, "a", list(range(9)))
    m.release_sequence("a")
    assert m.num_free_blocks == 6 and m.cached_prefix_length(list(range(9))) == 8
    assert _prefill(m, "b", list(range(9))) == 8
    assert m.num_free_blocks == 3                 # the revived blocks left the free queue
    m.release_sequence("b")
    _prefill(m, "c", list(range(50, 70)))         # needs 5 blocks: one cached block goes
    assert m.cached_prefix_length(list(range(9))) == 4
    m.release_sequence("c")
    _prefill(m, "d", list(range(80, 104)))        # the whole pool: every old entry goes
    assert m.cached_prefix_length(list(range(9))) == 0
    assert m.cached_prefix_length(list(range(50, 70))) == 0
