"""Unit tests of minipaged.kernels.decode_attention (CPU: Triton interpreter; GPU: compiled, more dtypes)."""

import math

import pytest
import torch

from minipaged.kernels.decode_attention import (PagedAttentionError, split_ranges,
                                                choose_num_splits, paged_attention,
                                                paged_attention_reference)
from minipaged.kernels.kv_cache import KVCacheError, PagedKVCache
from minipaged.runtime import by_device, default_device

DEVICE = default_device()
TOLERANCE = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def make_case(lengths, block_size, num_kv_heads, group, head_dim, dtype, seed=0, layout="NHD",
              pad_block=None):
    gen = torch.Generator().manual_seed(seed)
    blocks = [-(-n // block_size) for n in lengths]
    cache = PagedKVCache(1, sum(blocks) + 2, block_size, num_kv_heads, head_dim, dtype, DEVICE, layout)
    cache.storage.copy_(torch.randn(cache.storage.shape, generator=gen).to(dtype))
    pool = torch.randperm(cache.num_blocks, generator=gen).tolist()
    pad = cache.num_blocks - 1 if pad_block is None else pad_block
    tables = torch.full((len(lengths), max(blocks) + 2), pad, dtype=torch.int32)
    for b, n in enumerate(blocks):
        tables[b, :n] = torch.tensor([pool.pop() for _ in range(n)], dtype=torch.int32)
    query = torch.randn(len(lengths), num_kv_heads * group, head_dim, generator=gen).to(dtype)
    return query.to(DEVICE), cache, tables.to(DEVICE), torch.tensor(lengths, dtype=torch.int32).to(DEVICE)


def check(query, cache, tables, lens, splits, layer=0, scale=None):
    ref = paged_attention_reference(query, cache, layer, tables, lens, scale)
    out = paged_attention(query, cache, layer, tables, lens, scale=scale, num_splits=splits,
                          out=torch.full_like(query, float("nan")))
    assert out.dtype == query.dtype and out.shape == query.shape
    assert torch.isfinite(out).all()
    error = ((out.float() - ref).norm() / ref.norm()).item()
    assert error < TOLERANCE[query.dtype], error


CASES = by_device(
    cpu=[(1, 1, 64, torch.float32), (2, 4, 64, torch.float16), (4, 8, 128, torch.float16),
         (16, 2, 64, torch.float32), (32, 4, 64, torch.float16), (24, 2, 64, torch.float32)],
    gpu=[(bs, g, d, dt) for bs in (1, 2, 4, 16, 24, 32, 64) for g in (1, 2, 4, 8) for d in (64, 128)
         for dt in (torch.float32, torch.float16, torch.bfloat16)])


@pytest.mark.parametrize("block_size, group, head_dim, dtype", CASES)
def test_matches_fp32_reference(block_size, group, head_dim, dtype):
    lengths = [1, max(1, block_size - 1), block_size, block_size + 1, by_device(cpu=70, gpu=2100)]
    case = make_case(lengths, block_size, 2, group, head_dim, dtype, seed=block_size * group)
    for splits in (1, 3, None):
        check(*case, splits)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_layouts_and_custom_scale_and_other_layer(layout):
    query, cache, tables, lens = make_case([9, 30], 4, 2, 2, 64, torch.float32, seed=3, layout=layout)
    two_layers = PagedKVCache(2, cache.num_blocks, 4, 2, 64, torch.float32, DEVICE, layout)
    two_layers.storage[1].copy_(cache.storage[0])
    two_layers.storage[0].fill_(float("nan"))     # layer 0 must not be read
    check(query, two_layers, tables, lens, 2, layer=1, scale=0.3)


def test_padding_entries_of_block_tables_are_never_read():
    # a padding block id far outside the pool would fault or poison the result if it were read
    case = make_case([5, 17, 2], 4, 1, 4, 64, torch.float32, seed=5, pad_block=2**30)
    for splits in (1, 4):
        check(*case, splits)


def test_empty_sequence_gives_zeros_and_others_are_unaffected():
    query, cache, tables, lens = make_case([6, 1], 2, 1, 2, 64, torch.float32, seed=9)
    lens[1] = 0
    for splits in (1, 2):
        out = paged_attention(query, cache, 0, tables, lens, num_splits=splits)
        assert torch.equal(out[1], torch.zeros_like(out[1]))
        ref = paged_attention_reference(query[:1], cache, 0, tables[:1], lens[:1])
        assert torch.allclose(out[:1], ref, atol=1e-5)


def test_sentinels_identify_each_request_and_position():
    lengths, block_size = [5, 1, 8, 3], 2
    query, cache, tables, lens = make_case(lengths, block_size, 1, 2, 16, torch.float32, seed=7)
    cache.storage.zero_()
    query = torch.zeros_like(query)
    query[..., 0] = 1.0
    key, value = cache.token_view(cache.key_cache(0)), cache.token_view(cache.value_cache(0))
    for r, n in enumerate(lengths):
        for t in range(n):
            block, offset = int(tables[r, t // block_size]), t % block_size
            value[block, offset] = 1000.0 * r + t
            key[block, offset, :, 0] = 100.0 if t == n - 1 else 0.0
    for splits in (1, 2):
        out = paged_attention(query, cache, 0, tables, lens, scale=1.0, num_splits=splits)
        expected = torch.tensor([1000.0 * r + n - 1 for r, n in enumerate(lengths)], device=DEVICE)
        assert torch.allclose(out[..., 0], expected[:, None].expand(-1, 2), atol=1e-3)


@pytest.mark.parametrize("mutate, error, match", [
    (lambda q, t, s: (q.half(), t, s), PagedAttentionError, "cache holds"),
    (lambda q, t, s: (q[:, :3], t, s), PagedAttentionError, "multiple"),
    (lambda q, t, s: (q[..., :32], t, s), PagedAttentionError, "head_dim"),
    (lambda q, t, s: (q, t.long(), s), PagedAttentionError, "block_tables"),
    (lambda q, t, s: (q, t[:1], s), PagedAttentionError, "block_tables"),
    (lambda q, t, s: (q, t, s.long()), PagedAttentionError, "seq_lens"),
    (lambda q, t, s: (q[0], t, s), PagedAttentionError, "query must be"),
])
def test_rejects_bad_arguments(mutate, error, match):
    query, cache, tables, lens = make_case([3, 4], 2, 2, 2, 64, torch.float32)
    with pytest.raises(error, match=match):
        paged_attention(cache=cache, layer=0, **dict(zip(("query", "block_tables", "seq_lens"),
                                                          mutate(query, tables, lens))))
    with pytest.raises(KVCacheError, match="layer"):
        paged_attention(query, cache, 1, tables, lens)
    with pytest.raises(PagedAttentionError, match="out must be"):
        paged_attention(query, cache, 0, tables, lens, out=torch.empty(2, 4, 64, dtype=torch.float16,
                                                                        device=DEVICE))


def test_lengths_beyond_the_table_and_blocks_outside_the_cache_are_refused():
    query, cache, tables, lens = make_case([3, 4], 2, 2, 2, 64, torch.float32)
    too_long = lens.clone()
    too_long[1] = tables.shape[1] * 2 + 1
    with pytest.raises(PagedAttentionError, match="seq_lens must lie"):
        paged_attention(query, cache, 0, tables, too_long.to(DEVICE), check_tables=True)
    negative = lens.clone()
    negative[0] = -1
    with pytest.raises(PagedAttentionError, match="seq_lens must lie"):
        paged_attention(query, cache, 0, tables, negative.to(DEVICE), check_tables=True)
    for bad_id in (-1, cache.num_blocks):
        bad = tables.clone()
        bad[1, 1] = bad_id                            # block 1 of a 4-token sequence at block size 2
        with pytest.raises(PagedAttentionError, match=r"block_tables\[1, 1\]"):
            paged_attention(query, cache, 0, bad, lens, check_tables=True)
    unread = tables.clone()
    unread[0, 2:] = -1                                # past a 3-token sequence's 2 blocks: never read
    check(query, cache, unread, lens, 2)


def test_split_rule():
    cpu = torch.device("cpu")                     # the interpreter counts 4 "SMs"
    assert choose_num_splits(64, 8, 4096, cpu) == 1
    assert choose_num_splits(1, 1, 10_000, cpu) == 8
    assert choose_num_splits(1, 1, 300, cpu) == 1          # too short to split
    assert choose_num_splits(1, 1, 10**7, cpu, programs_per_sm=100) == 64


@pytest.mark.parametrize("splits, min_split", [(None, None), (3, None), (4, 64), (8, 1)])
def test_ragged_lengths_wide_tables_and_any_split_give_the_same_answer(splits, min_split):
    """Each program cuts its own sequence's length: a table far wider than the lengths
    (a CUDA graph's, sized for the longest possible sequence) changes nothing."""
    lengths = [1, 37, 300, 5, 129, 0, 64]
    query, cache, tables, lens = make_case(lengths, 4, 2, 4, 64, torch.float32, seed=3)
    ref = paged_attention_reference(query, cache, 0, tables, lens)
    wide = torch.cat([tables, tables.new_full((len(lengths), 200), cache.num_blocks - 1)], 1)
    for t in (tables, wide):
        out = paged_attention(query, cache, 0, t, lens, num_splits=splits, min_split=min_split,
                              out=torch.full_like(query, float("nan")))
        assert ((out - ref).norm() / ref.norm()).item() < 1e-5


def test_split_ranges_follow_each_length():
    assert split_ranges(1000, 4, granule=64) == (256, 4)
    assert split_ranges(100, 4, granule=64) == (64, 2)
    assert split_ranges(100, 4, granule=64, min_split=256) == (256, 1)
    for length in range(1, 600, 7):
        per, used = split_ranges(length, 5, granule=16, min_split=48)
        assert per % 16 == 0 and per >= 48 and (used - 1) * per < length <= used * per


@pytest.mark.parametrize("block_size, group, dtype", [(4, 4, torch.float32), (16, 1, torch.float16),
                                                      (32, 2, torch.float16)])
def test_teaching_version_1_matches_the_reference(block_size, group, dtype):
    from minipaged.kernels.decode_attention import _paged_attention_v1

    query, cache, tables, lens = make_case([1, 7, 16, 17, 50, 0], block_size, 2, group, 32, dtype,
                                           seed=block_size)
    ref = paged_attention_reference(query, cache, 0, tables, lens)
    out = _paged_attention_v1(query, cache, 0, tables, lens)
    assert ((out.float() - ref).norm() / ref.norm()).item() < TOLERANCE[dtype]
    assert torch.equal(out[-1], torch.zeros_like(out[-1]))        # length 0 gives zeros


def test_precision_is_set_only_for_fp32():
    from minipaged.kernels.decode_attention import fp32_precision

    assert fp32_precision(torch.float32) == "ieee"
    assert fp32_precision(torch.float16) is None and fp32_precision(torch.bfloat16) is None
