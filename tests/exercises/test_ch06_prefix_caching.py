"""Checks for the chapter 6 exercises (exercises/ch06_prefix_caching.py)."""

from minipaged.prefix_cache import chained_block_hash
from tests.exercises.answers import load

ex = load("ch06_prefix_caching")


def test_6_1_block_hashes():
    tokens = list(range(10))
    hashes = ex.block_hashes(tokens, 4, chained_block_hash)
    assert len(hashes) == 2                                        # the partial third block has none
    assert hashes[0] == chained_block_hash(None, (0, 1, 2, 3))
    assert hashes[1] == chained_block_hash(hashes[0], (4, 5, 6, 7))
    changed = ex.block_hashes(tokens[:5] + [99] + tokens[6:], 4, chained_block_hash)
    assert changed[0] == hashes[0] and changed[1] != hashes[1]
    assert ex.block_hashes([], 4, chained_block_hash) == []
    tag = ex.block_hashes([1, 2, 3, 4], 2, lambda parent, block: (parent or 0) * 10 + sum(block))
    assert tag == [3, 37]                                          # the chain really uses the parent


def test_6_2_reusable_prefix_tokens():
    prefix = list(range(32))
    cached = set(ex.block_hashes(prefix, 16, chained_block_hash))
    assert ex.reusable_prefix_tokens(prefix, cached, 16, chained_block_hash) == 16
    assert ex.reusable_prefix_tokens(prefix + [5], cached, 16, chained_block_hash) == 32
    assert ex.reusable_prefix_tokens([1] + prefix[1:] + [5], cached, 16, chained_block_hash) == 0
    assert ex.reusable_prefix_tokens(prefix[:16] + [0] * 17, cached, 16, chained_block_hash) == 16
    assert ex.reusable_prefix_tokens([], cached, 16, chained_block_hash) == 0


def test_6_3_blocks_taken():
    assert ex.blocks_taken(40, 16, 2, 0) == 1
    assert ex.blocks_taken(40, 16, 2, 2) == 3
    assert ex.blocks_taken(40, 16, 0, 0) == 3
    assert ex.blocks_taken(16, 16, 0, 0) == 1
