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
