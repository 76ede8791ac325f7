"""Chapter 6 reference solutions."""

from collections.abc import Callable, Sequence

HashFn = Callable[[int | None, tuple[int, ...]], int]


def predict_changed_hashes() -> dict[str, list[int]]:
    # a hash covers its block and, through the chain, every block before it
    return {"token_13": [1, 2, 3, 4], "token_39": [4], "token_0": [0, 1, 2, 3, 4],
            "append_3": [], "swap_blocks_3_4": [3, 4]}


def reusable_prefix_tokens(prompt: Sequence[int], cached_hashes: set[int], block_size: int,
                           hash_fn: HashFn) -> int:
    limit = max(len(prompt) - 1, 0) // block_size        # the last prompt token is computed
    parent, reused = None, 0
    for j in range(limit):
        parent = hash_fn(parent, tuple(prompt[j * block_size:(j + 1) * block_size]))
        if parent not in cached_hashes:
            break
        reused += 1
    return reused * block_size


def predict_admissions() -> dict[str, list[int]]:
    # A takes 3 blocks and finds nothing; released, its 2 full blocks stay cached among the 10
    # free ones. B finds them (8 tokens): 2 revived from the free queue + 2 new. C finds the same
    # 8 tokens, held by B (free of charge), + 1 new. D is exactly 8 cached tokens: the last one is
    # computed, so it reuses one block and takes a new one for tokens 4..7.
    return {"reused": [0, 8, 8, 4], "free": [7, 10, 6, 5, 4]}


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
