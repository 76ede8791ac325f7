"""The appendix's ragged decode with the work split by tokens. The plan partitions every sequence
into chunks (hypothesis), and the kernel matches chapter 8's reference under the interpreter."""

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged.kernels.decode_attention import PagedAttentionError, paged_attention_reference
from minipaged.kernels.balanced_decode import balanced_paged_attention, plan_decode_work, work_chunk
from minipaged.kernels.kv_cache import PagedKVCache


def ragged_case(lengths, block_size, group, dtype, seed=0, head_dim=32, kv_heads=2):
    gen = torch.Generator().manual_seed(seed)
    widths = [-(-n // block_size) for n in lengths]
    cache = PagedKVCache(1, sum(widths) + 1, block_size, kv_heads, head_dim, dtype)
    cache.storage.copy_(torch.randn(cache.storage.shape, generator=gen).to(dtype))
    pool = torch.randperm(cache.num_blocks, generator=gen).to(torch.int32)
    tables = torch.full((len(lengths), max(widths) + 1), int(pool[-1]), dtype=torch.int32)
    for b, start in enumerate(itertools.accumulate([0] + widths[:-1])):
        tables[b, :widths[b]] = pool[start:start + widths[b]]
    query = torch.randn(len(lengths), kv_heads * group, head_dim, generator=gen).to(dtype)
    return query, cache, tables, torch.tensor(lengths, dtype=torch.int32)


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(0, 5000), min_size=1, max_size=40),
       block_size=st.sampled_from([1, 4, 16, 48, 256]), kv_heads=st.integers(1, 8),
       num_sms=st.integers(1, 132), programs_per_sm=st.integers(1, 16),
       min_chunk=st.integers(1, 4096))
def test_the_plan_cuts_every_sequence_into_chunks_in_order(lengths, block_size, kv_heads,
                                                           num_sms, programs_per_sm,
                                                           min_chunk):
    cache = PagedKVCache(1, 1, block_size, kv_heads, 8, torch.float32)
    work = plan_decode_work(lengths, cache, num_sms=num_sms,
                            programs_per_sm=programs_per_sm, min_chunk=min_chunk)
    items, first = work.items.numpy(), work.first_item.numpy()
    granule = max(work.config[0], block_size)
    assert work.chunk % granule == 0 and work.chunk >= min_chunk
    assert first[0] == 0 and first[-1] == len(items) and (np.diff(first) >= 1).all()
    for b, n in enumerate(lengths):
        mine = items[first[b]:first[b + 1]]
        assert (mine[:, 0] == b).all()
        assert mine[0, 1] == 0 and mine[-1, 2] == n               # covers [0, n) ...
        assert (mine[1:, 1] == mine[:-1, 2]).all()                 # ... with no gap or overlap
        assert (mine[:, 2] - mine[:, 1] <= work.chunk).all()
        assert (mine[:, 1] % granule == 0).all()                   # tiles start where they may
        assert (mine[:, 3] == (len(mine) == 1)).all()              # direct iff not cut
        assert n == 0 or (mine[:, 2] > mine[:, 1]).all()           # no empty item but length 0
    target = max(1, programs_per_sm * num_sms // kv_heads)
    assert len(items) <= max(target, sum(lengths) // work.chunk + 1) + len(lengths)
    assert work.any_split == bool((np.diff(first) > 1).any())


def test_work_chunk_spreads_tokens_over_the_programs_in_whole_granules():
    assert work_chunk(100_000, 8, 132, 128) == 1536        # 66 items: 1,516 tokens, rounded
    assert work_chunk(10, 8, 132, 128) == 128             # at least min_chunk
    assert work_chunk(0, 8, 132, 16, min_chunk=1) == 16   # an empty batch still gets a chunk


@pytest.mark.parametrize("lengths, block_size, group, dtype", [
    ([0, 1, 7, 8, 9, 40, 300], 4, 4, torch.float32),
    ([5, 33, 2, 64, 200], 16, 1, torch.float16),
    ([70, 3, 129, 16], 32, 4, torch.float16),
    ([0, 0, 0], 16, 2, torch.float32),
    ([500], 6, 2, torch.float32)])
@pytest.mark.parametrize("min_chunk", [16, 48, 4096])
def test_balanced_decode_matches_the_reference(lengths, block_size, group, dtype, min_chunk):
    query, cache, tables, lens = ragged_case(lengths, block_size, group, dtype)
    ref = paged_attention_reference(query, cache, 0, tables, lens).float()
    work = plan_decode_work(lengths, cache, min_chunk=min_chunk, num_sms=4)
    out = torch.full_like(query, float("nan"))
    balanced_paged_attention(query, cache, 0, tables, lens, work, out=out)
    assert torch.isfinite(out).all()
    tolerance = 1e-5 if dtype == torch.float32 else 3e-3
    assert (out.float() - ref).abs().max() <= tolerance * max(1.0, ref.abs().max().item())
    if min_chunk == 16 and max(lengths) > 100:
        assert work.any_split                       # the merge ran


def test_a_plan_for_another_batch_or_block_size_is_refused():
    query, cache, tables, lens = ragged_case([5, 40], 4, 2, torch.float32)
    other = PagedKVCache(1, 4, 8, 2, 32, torch.float32)
    for work in (plan_decode_work([5, 40, 3], cache), plan_decode_work([5, 40], other)):
        with pytest.raises(PagedAttentionError, match="work plan"):
            balanced_paged_attention(query, cache, 0, tables, lens, work)
    with pytest.raises(PagedAttentionError, match=">= 0"):
        plan_decode_work([5, -1], cache)
    with pytest.raises(PagedAttentionError, match="seq_lens must lie"):
        balanced_paged_attention(query, cache, 0, tables, lens + 100,
                                 plan_decode_work([105, 140], cache))
