"""Unit tests of minipaged.kv_cache beyond the chapter's own checks (CPU: Triton interpreter)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged.kv_cache import (LAYOUTS, KVCacheError, PagedKVCache, copy_blocks_reference,
                                write_kv_reference)
from minipaged.sizing import kv_bytes_per_token


def filled(cache: PagedKVCache, seed: int = 0) -> PagedKVCache:
    cache.storage.copy_(torch.randn(cache.storage.shape, generator=torch.Generator().manual_seed(seed)))
    return cache


def twin(cache: PagedKVCache) -> PagedKVCache:
    other = PagedKVCache(cache.num_layers, cache.num_blocks, cache.block_size, cache.num_kv_heads,
                         cache.head_dim, cache.dtype, cache.device, cache.layout)
    other.storage.copy_(cache.storage)
    return other


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("num_heads,head_dim", [(1, 16), (3, 24), (4, 64)])
def test_write_matches_reference(layout, dtype, num_heads, head_dim):
    ours = filled(PagedKVCache(2, 7, 3, num_heads, head_dim, dtype, "cpu", layout))
    ref = twin(ours)
    n = 11
    gen = torch.Generator().manual_seed(n)
    slots = torch.randperm(ours.num_slots, generator=gen)[:n]
    slots[[1, 5]] = -1
    key = torch.randn(n, num_heads, head_dim, generator=gen).to(dtype)
    value = torch.randn(n, num_heads, head_dim, generator=gen).to(dtype)
    ours.write(1, key, value, slots)
    write_kv_reference(ref, 1, key, value, slots)
    assert torch.equal(ours.storage, ref.storage)
    assert not torch.equal(ours.storage, filled(twin(ours)).storage)  # something was written


def test_write_accepts_strided_inputs_and_int32_slots():
    cache = PagedKVCache(1, 4, 4, 2, 8, torch.float32, "cpu")
    ref = twin(cache)
    qkv = torch.randn(5, 3, 2, 8)
    key, value = qkv[:, 0], qkv[:, 1]          # non-contiguous views, as from a fused projection
    slots = torch.tensor([3, 0, 15, 8, 9], dtype=torch.int32)
    cache.write(0, key, value, slots)
    write_kv_reference(ref, 0, key, value, slots)
    assert torch.equal(cache.storage, ref.storage)


def test_bad_slot_raises_and_writes_nothing():
    cache = filled(PagedKVCache(1, 4, 4, 2, 8, torch.float32, "cpu"))
    before = cache.storage.clone()
    key = torch.randn(3, 2, 8)
    for bad in ([0, 1, 16], [0, -2, 3]):
        with pytest.raises(KVCacheError, match="slot"):
            cache.write(0, key, key, torch.tensor(bad))
        assert torch.equal(cache.storage, before)


def test_unchecked_out_of_range_slot_is_skipped_not_written():
    cache = filled(PagedKVCache(1, 4, 4, 2, 8, torch.float32, "cpu"))
    before = cache.storage.clone()
    key = torch.randn(2, 2, 8)
    cache.write(0, key, key, torch.tensor([16, 5]), check_slots=False)
    changed = (cache.storage != before).any(dim=-1).any(dim=-1).flatten().nonzero().flatten().tolist()
    assert changed == [5, 16 + 5]                # token 5 of layer 0's K and of its V, nothing else


@pytest.mark.parametrize("bad, match", [
    (lambda k, s: (k[:, :1], k, s), "key must have shape"),
    (lambda k, s: (k, k.to(torch.int32), s), "floating-point"),
    (lambda k, s: (k, k, s.float()), "slot_mapping"),
    (lambda k, s: (k, k, s[:, None]), "slot_mapping"),
])
def test_write_rejects_bad_arguments(bad, match):
    cache = PagedKVCache(1, 4, 4, 2, 8, torch.float32, "cpu")
    key, slots = torch.randn(3, 2, 8), torch.tensor([0, 1, 2])
    with pytest.raises(KVCacheError, match=match):
        cache.write(0, *bad(key, slots))
    with pytest.raises(KVCacheError, match="layer"):
        cache.write(1, key, key, slots)


@settings(max_examples=15, deadline=None)
@given(block_size=st.sampled_from([1, 2, 3, 4, 16]), lengths=st.lists(st.integers(0, 20), min_size=1, max_size=3),
       layout=st.sampled_from(LAYOUTS), seed=st.integers(0, 2**16))
def test_interleaved_writes_gather_back(block_size, lengths, layout, seed):
    blocks = [-(-n // block_size) for n in lengths]
    cache = PagedKVCache(1, sum(blocks) + 1, block_size, 2, 4, torch.float32, "cpu", layout)
    gen = torch.Generator().manual_seed(seed)
    pool = torch.randperm(cache.num_blocks, generator=gen).tolist()
    tables = [[pool.pop() for _ in range(b)] for b in blocks]
    order = [r for r, n in enumerate(lengths) for _ in range(n)]
    order = [order[i] for i in torch.randperm(len(order), generator=gen).tolist()]
    done = [0] * len(lengths)
    for r in order:                               # one token at a time, requests interleaved
        t = done[r]
        slot = tables[r][t // block_size] * block_size + t % block_size
        kv = torch.full((1, 2, 4), 1000.0 * r + t)
        cache.write(0, kv, -kv, torch.tensor([slot]))
        done[r] += 1
    for r, n in enumerate(lengths):
        k, v = cache.gather(0, tables[r], n)
        expected = (1000.0 * r + torch.arange(n, dtype=torch.float32))[:, None, None].expand(n, 2, 4)
        assert k.is_contiguous() and torch.equal(k, expected) and torch.equal(v, -expected)


def test_gather_rejects_too_many_tokens():
    cache = PagedKVCache(1, 4, 4, 2, 8, torch.float32, "cpu")
    with pytest.raises(KVCacheError, match="do not fit"):
        cache.gather(0, [1, 2], 9)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_copy_blocks_matches_reference_and_refuses_atomically(layout):
    ours = filled(PagedKVCache(3, 9, 4, 2, 8, torch.float16, "cpu", layout))
    ref = twin(ours)
    pairs = [(0, 8), (3, 1), (0, 4)]
    ours.copy_blocks(torch.tensor(pairs))
    copy_blocks_reference(ref, pairs)
    assert torch.equal(ours.storage, ref.storage)
    before = ours.storage.clone()
    for bad in ([(1, 2), (2, 5)], [(1, 2), (3, 2)], [(9, 0)], [(0, -1)]):
        with pytest.raises(KVCacheError):
            ours.copy_blocks(bad)
        assert torch.equal(ours.storage, before)
    ours.copy_blocks([])
    assert torch.equal(ours.storage, before)


def test_swap_round_trip_and_geometry_check():
    gpu = filled(PagedKVCache(2, 6, 4, 2, 8, torch.float32, "cpu"))
    original = gpu.storage.clone()
    host = gpu.cpu_pool(2)
    gpu.swap_out(host, [(4, 1), (0, 0)])
    gpu.storage.zero_()
    gpu.swap_in(host, [(1, 2), (0, 3)])
    assert torch.equal(gpu.storage[:, :, 2], original[:, :, 4])
    assert torch.equal(gpu.storage[:, :, 3], original[:, :, 0])
    with pytest.raises(KVCacheError, match="destination blocks"):
        gpu.swap_out(host, [(0, 2)])
    other = PagedKVCache(2, 6, 8, 2, 8, torch.float32, "cpu")
    with pytest.raises(KVCacheError, match="block_size"):
        gpu.swap_out(other, [(0, 0)])


def test_from_budget_sizes_whole_blocks():
    per_block = 16 * kv_bytes_per_token(28, 8, 128, 2)
    cache = PagedKVCache.from_budget(10 * per_block + per_block - 1, 28, 16, 8, 128,
                                     torch.bfloat16, "meta")
    assert cache.num_blocks == 10 and cache.nbytes == 10 * per_block
    with pytest.raises(KVCacheError, match="holds no block"):
        PagedKVCache.from_budget(per_block - 1, 28, 16, 8, 128, torch.bfloat16, "meta")


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_blocks=0), "num_blocks"), (dict(block_size=2.0), "block_size"),
    (dict(layout="nhd"), "layout"), (dict(dtype=torch.int8), "dtype")])
def test_constructor_rejects_bad_geometry(kwargs, match):
    args = dict(num_layers=1, num_blocks=2, block_size=2, num_kv_heads=1, head_dim=4, device="cpu")
    with pytest.raises(KVCacheError, match=match):
        PagedKVCache(**(args | kwargs))
