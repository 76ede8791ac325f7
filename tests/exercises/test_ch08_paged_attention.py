"""Checks for the chapter 8 exercises (exercises/ch08_paged_attention.py)."""

import math

import pytest
import torch

from minipaged.memory.block_table import blocks_needed
from minipaged.kernels.kv_cache import PagedKVCache
from minipaged.runtime import default_device
from tests.exercises.answers import load

ex = load("ch08_paged_attention")
DEVICE = default_device()


def test_8_1_decode_step_bytes():
    assert ex.decode_step_kv_bytes(1, 28, 8, 128, 2) == 114_688
    assert ex.decode_step_kv_bytes(64_000, 28, 8, 128, 2) == 64_000 * 114_688
    assert ex.decode_step_kv_bytes(3, 1, 1, 1, 4) == 24


def test_8_1_kv_equals_weights():
    assert ex.kv_equals_weights(1.2e9, 28, 8, 128, 2) == pytest.approx(10_463, rel=1e-3)
    assert ex.kv_equals_weights(8, 1, 1, 1, 4) == pytest.approx(1)


# Exercise 8.2: a grader that runs a sliding-window decode function against a reference.
# Positions before each sequence's window hold NaN, so a kernel that reads them (a missing
# lower mask, an unmasked V load) fails; the planted bugs below must fail it too.

def window_case(block_size, seed):
    lengths = [1, 5, 17, 40, 70]
    gen = torch.Generator().manual_seed(seed)
    blocks = [blocks_needed(n, block_size) for n in lengths]
    cache = PagedKVCache(1, sum(blocks) + 1, block_size, 2, 32, torch.float16, DEVICE)
    cache.storage.copy_(torch.randn(cache.storage.shape, generator=gen).half())
    pool = torch.randperm(cache.num_blocks, generator=gen).tolist()
    tables = torch.full((len(lengths), max(blocks) + 1), cache.num_blocks - 1, dtype=torch.int32)
    for b, n in enumerate(blocks):
        tables[b, :n] = torch.tensor([pool.pop() for _ in range(n)], dtype=torch.int32)
    query = torch.randn(len(lengths), 4, 32, generator=gen).half()
    return (query.to(DEVICE), cache, tables.to(DEVICE),
            torch.tensor(lengths, dtype=torch.int32).to(DEVICE))


def window_reference(query, cache, tables, lens, lo_of):
    out = torch.zeros(query.shape, dtype=torch.float32, device=query.device)
    for b in range(query.shape[0]):
        n = int(lens[b])
        k, v = cache.gather(0, tables[b, :blocks_needed(n, cache.block_size)], n)
        lo = lo_of(n)
        k, v = (x[lo:].float().repeat_interleave(2, dim=1) for x in (k, v))
        p = (torch.einsum("hd,thd->ht", query[b].float(), k) / math.sqrt(32)).softmax(-1)
        out[b] = torch.einsum("ht,thd->hd", p, v)
    return out


def check_window(fn):
    for block_size, window in ((4, 7), (16, 5), (32, 33), (4, 1), (16, 1000)):
        query, cache, tables, lens = window_case(block_size, seed=block_size + window)
        ref = window_reference(query, cache, tables, lens, lambda n: max(0, n - window))
        view = [cache.token_view(cache.key_cache(0)), cache.token_view(cache.value_cache(0))]
        for b, n in enumerate(lens.tolist()):
            for t in range(max(0, n - window)):                  # poison what lies before
                for x in view:
                    x[int(tables[b, t // block_size]), t % block_size] = float("nan")
        out = fn(query, cache, 0, tables, lens, window)
        assert out.shape == query.shape, "the result must be shaped like the query"
        assert torch.isfinite(out).all(), (f"block size {block_size}, window {window}: "
                                           "read a position before the window (NaN)")
        error = ((out.float() - ref).norm() / ref.norm()).item()
        assert error < 3e-3, f"block size {block_size}, window {window}: error {error:.1e}"


def test_8_2_sliding_window_kernel():
    check_window(ex.sliding_window_attention)


def planted(lo_of):
    def fn(query, cache, layer, tables, lens, window):
        return window_reference(query, cache, tables, lens, lambda n: lo_of(n, window)).half()
    return fn


@pytest.mark.parametrize("bug", [
    planted(lambda n, w: max(0, n - w - 1)),             # one token too many
    planted(lambda n, w: max(0, n - w + 1)),             # one token too few
    planted(lambda n, w: 0),                             # no window at all
])
@pytest.mark.grader
def test_8_2_the_grader_rejects_planted_bugs(bug):
    with pytest.raises(AssertionError):
        check_window(bug)
