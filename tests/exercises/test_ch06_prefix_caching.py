"""Checks for the chapter 6 exercises (exercises/ch06_prefix_caching.py)."""

from minipaged.memory.prefix_cache import chained_block_hash
from tests.exercises.answers import load

ex = load("ch06_prefix_caching")


def chain(tokens, block_size, hash_fn=chained_block_hash):
    """The chained hashes of the full blocks, computed here."""
    hashes = []
    for j in range(len(tokens) // block_size):
        hashes.append(hash_fn(hashes[-1] if hashes else None,
                              tuple(tokens[j * block_size:(j + 1) * block_size])))
    return hashes


def test_6_1_predict_changed_hashes():
    tokens = list(range(40))
    edits = {"token_13": tokens[:13] + [99] + tokens[14:], "token_39": tokens[:39] + [99],
             "token_0": [99] + tokens[1:], "append_3": tokens + [1, 2, 3],
             "swap_blocks_3_4": tokens[:24] + tokens[32:] + tokens[24:32]}
    before = chain(tokens, 8, lambda parent, block: hash((parent, block)))
    predicted = ex.predict_changed_hashes()
    for name, edited in edits.items():
        after = chain(edited, 8, lambda parent, block: hash((parent, block)))
        changed = [j for j in range(len(before)) if after[j] != before[j]]
        assert name in predicted, f"predict the changed hashes for each of {sorted(edits)}"
        assert sorted(predicted[name]) == changed, \
            f"{name}: you predicted hashes {sorted(predicted[name])} change, {changed} do"


def test_6_2_reusable_prefix_tokens():
    prefix = list(range(32))
    cached = set(chain(prefix, 16))
    assert ex.reusable_prefix_tokens(prefix, cached, 16, chained_block_hash) == 16
    assert ex.reusable_prefix_tokens(prefix + [5], cached, 16, chained_block_hash) == 32
    assert ex.reusable_prefix_tokens([1] + prefix[1:] + [5], cached, 16, chained_block_hash) == 0
    assert ex.reusable_prefix_tokens(prefix[:16] + [0] * 17, cached, 16, chained_block_hash) == 16
    assert ex.reusable_prefix_tokens([], cached, 16, chained_block_hash) == 0
    tag = lambda parent, block: (parent or 0) * 10 + sum(block)   # noqa: E731  (uses the parent)
    assert ex.reusable_prefix_tokens([1, 2, 3, 4, 5], {3, 37}, 2, tag) == 4
    assert ex.reusable_prefix_tokens([1, 2, 3, 4, 5], {3, 7}, 2, tag) == 2


def test_6_3_predict_admissions():
    from minipaged.memory.prefix_cache import PrefixCachingBlockManager

    m, reused, free = PrefixCachingBlockManager(10, 4), [], []
    prompts = {"A": list(range(10)), "B": list(range(8)) + list(range(100, 106)),
               "C": list(range(8)) + [200], "D": list(range(8))}
    for seq, prompt in prompts.items():
        cached = m.allocate_prompt(seq, prompt)
        m.commit_step(m.reserve_step({seq: len(prompt) - cached}))
        reused.append(cached)
        free.append(m.num_free_blocks)
        if seq == "A":
            m.release_sequence("A")
            free.append(m.num_free_blocks)
    predicted = ex.predict_admissions()
    assert list(predicted["reused"]) == reused, \
        f"you predicted {list(predicted['reused'])} reused tokens; the manager reuses {reused}"
    assert list(predicted["free"]) == free, \
        f"you predicted {list(predicted['free'])} free blocks; the manager has {free}"


# Exercise 6.4: the learner's checks must pass on the real manager and fail on each planted bug.
import pytest  # noqa: E402

from minipaged.memory.prefix_cache import PrefixCachingBlockManager  # noqa: E402


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
