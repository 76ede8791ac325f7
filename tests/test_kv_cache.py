"""Unit tests of minipaged.kernels.kv_cache beyond the chapter's own checks (CPU: Triton interpreter)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged.kernels.kv_cache import (LAYOUTS, KVCacheError, PagedKVCache, copy_blocks_reference,
                                        write_kv_reference)
from minipaged.memory.sizing import kv_bytes_per_token


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


def _run_step(manager, cache, batch, expected, value_of) -> int:
    """Reserve a step, run its copy-on-write copies on the cache, write every new token, commit.
    Returns the number of copies the step needed."""
    reservation = manager.reserve_step(batch)
    cache.copy_blocks(reservation.copies)
    tokens = [(seq, manager.sequence_length(seq) + i) for seq, n in batch.items() for i in range(n)]
    values = torch.tensor([value_of(seq, position) for seq, position in tokens])
    kv = values.view(-1, 1, 1).expand(-1, cache.num_kv_heads, cache.head_dim).contiguous()
    for layer in range(cache.num_layers):
        cache.write(layer, kv, -kv, reservation.slot_mapping)
    manager.commit_step(reservation)
    for (seq, _), value in zip(tokens, values.tolist()):
        expected[seq].append(value)
    return len(reservation.copies)


def _assert_histories(manager, cache, expected):
    for seq, values in expected.items():
        want = torch.tensor(values).view(-1, 1, 1).expand(-1, cache.num_kv_heads, cache.head_dim)
        for layer in range(cache.num_layers):
            key, value = cache.gather(layer, manager.block_table(seq), manager.sequence_length(seq))
            assert torch.equal(key, want) and torch.equal(value, -want), (seq, layer)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_sharing_managers_copy_lists_run_on_the_cache(layout):
    """Chapter 5's copy-on-write and swap copy lists, executed by this cache: after forks, copies,
    a swap out and in, and block reuse, every sequence reads back exactly its own history."""
    from minipaged.memory.sharing import SharingBlockManager

    manager = SharingBlockManager(num_physical_blocks=12, block_size=4, num_cpu_blocks=6)
    cache = PagedKVCache(2, 12, 4, 2, 8, torch.float32, "cpu", layout)
    host = cache.cpu_pool(6)
    expected = {0: []}
    value_of = lambda seq, position: 1000.0 * seq + position  # noqa: E731
    manager.create_sequence(0)
    _run_step(manager, cache, {0: 6}, expected, value_of)
    for child in (1, 2):
        manager.fork(0, child)
        expected[child] = list(expected[0])
    copies = sum(_run_step(manager, cache, {0: 1, 1: 1, 2: 3}, expected, value_of) for _ in range(2))
    assert copies == 2                                            # the partly filled prompt block
    cache.swap_out(host, manager.swap_out(1))
    _run_step(manager, cache, {0: 1, 2: 1}, expected, value_of)   # reuses the swapped-out blocks
    manager.release_sequence(2)
    del expected[2]
    cache.swap_in(host, manager.swap_in(1))
    _run_step(manager, cache, {0: 1, 1: 1}, expected, value_of)
    assert manager.invariants_ok()
    _assert_histories(manager, cache, expected)


def test_prefix_cache_hits_point_at_blocks_holding_the_same_tokens():
    """Chapter 6's cache hits, read through this cache: a request that reuses cached blocks reads
    back exactly what it would have written itself (values depend on token and position only)."""
    from minipaged.memory.prefix_cache import PrefixCachingBlockManager

    manager = PrefixCachingBlockManager(num_physical_blocks=10, block_size=4)
    cache = PagedKVCache(1, 10, 4, 1, 8, torch.float32, "cpu")
    prompts = {"a": list(range(10, 21)), "b": list(range(10, 21)) + [5, 6],
               "c": list(range(10, 16)) + [99] + list(range(17, 21))}
    value_of = lambda seq, position: 100.0 * prompts[seq][position] + position  # noqa: E731
    expected, cached = {}, {}
    for seq in ("a", "b", "c"):
        cached[seq] = manager.allocate_prompt(seq, prompts[seq])
        expected[seq] = [value_of(seq, p) for p in range(cached[seq])]
        _run_step(manager, cache, {seq: len(prompts[seq]) - cached[seq]}, expected, value_of)
    assert cached == {"a": 0, "b": 8, "c": 4}
    assert manager.block_table("b")[:2] == manager.block_table("a")[:2]
    _assert_histories(manager, cache, expected)
