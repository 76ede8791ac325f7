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


# Exercise 6.4: the learner's checks must pass on the real manager and fail on each planted bug.
import pytest  # noqa: E402

from minipaged.prefix_cache import PrefixCachingBlockManager  # noqa: E402


class NoLastTokenRule(PrefixCachingBlockManager):
    """Bug (rule 2): a prompt that fills whole blocks is found entirely, last token included."""

    def _max_cached_blocks(self, num_prompt_tokens):
        return num_prompt_tokens // self.block_size if self.enable_prefix_caching else 0


class CachesPartialBlocks(PrefixCachingBlockManager):
    """Bug (rule 1): the partly filled last block is registered too, with its partial tokens."""

    def _register_full_blocks(self, state):
        bs, chain, tokens = self.block_size, self._chain[state.seq_id], self._tokens[state.seq_id]
        for j in range(len(chain), -(-min(state.length, len(tokens)) // bs)):
            block = state.block_table[j]
            block_tokens = tuple(tokens[j * bs:(j + 1) * bs])
            block_hash = self.hash_fn(chain[-1] if chain else None, block_tokens)
            if self._block_hash[block] is None:
                parent = self._identity(state.block_table[j - 1]) if j else None
                self._register(block, block_hash, block_tokens, parent, state.seq_id)
            chain.append(block_hash)


class TrustsTheHash(PrefixCachingBlockManager):
    """Bug (rule 3): a hash match is taken as a hit without comparing tokens or parent."""

    def _match(self, token_ids, max_blocks):
        bs, block_hash, chain = self.block_size, None, []
        for j in range(max_blocks):
            block_hash = self.hash_fn(block_hash, tuple(token_ids[j * bs:(j + 1) * bs]))
            if not self._cache.get(block_hash):
                break
            chain.append(self._cache[block_hash][0])
        return chain


class IgnoresTheParent(PrefixCachingBlockManager):
    """Bug (rule 3): tokens are compared, the parent block is not."""

    def _match(self, token_ids, max_blocks):
        bs, block_hash, chain = self.block_size, None, []
        for j in range(max_blocks):
            tokens = tuple(token_ids[j * bs:(j + 1) * bs])
            block_hash = self.hash_fn(block_hash, tokens)
            found = [b for b in self._cache.get(block_hash, ()) if self._block_tokens[b] == tokens]
            if not found:
                break
            chain.append(found[0])
        return chain


class ForgetsOnRelease(PrefixCachingBlockManager):
    """Bug (rule 4): a block's cache entry is dropped as soon as its last user releases it."""

    def _drop_block(self, block, seq_id):
        super()._drop_block(block, seq_id)
        if self._refcount[block] == 0 and self._block_hash[block] is not None:
            self._evict(block, seq_id)


class EvictsNewestFirst(PrefixCachingBlockManager):
    """Bug (rule 4): freed cached blocks are handed out most recently freed first."""

    def _drop_block(self, block, seq_id):
        super()._drop_block(block, seq_id)
        if self._refcount[block] == 0:
            self._free.push_front(block)


class RevivedBlockStaysFree(PrefixCachingBlockManager):
    """Bug (rule 4): a hit on a free cached block leaves it in the free queue as well."""

    def allocate_prompt(self, seq_id, prompt_token_ids):
        revived = [b for b in self._match(prompt_token_ids,
                                          self._max_cached_blocks(len(prompt_token_ids)))
                   if self._refcount[b] == 0]
        computed = super().allocate_prompt(seq_id, prompt_token_ids)
        for block in revived:
            self._free.push(block)
        return computed


def test_6_4_checks_pass_on_the_real_manager():
    ex.prefix_cache_checks(PrefixCachingBlockManager)


@pytest.mark.parametrize("buggy", [NoLastTokenRule, CachesPartialBlocks, TrustsTheHash,
                                   IgnoresTheParent, ForgetsOnRelease, EvictsNewestFirst,
                                   RevivedBlockStaysFree])
def test_6_4_checks_catch_planted_bugs(buggy):
    with pytest.raises(AssertionError):
        ex.prefix_cache_checks(buggy)
