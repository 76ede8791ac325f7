"""Checks for the chapter 7 exercises (exercises/ch07_paged_kv_cache.py)."""

import pytest
import torch

from minipaged.kv_cache import PagedKVCache
from tests.exercises.answers import load

ex = load("ch07_paged_kv_cache")


def test_7_1_slot_of_the_seed_example():
    table = [5, 2, 9]
    assert [ex.slot_of(table, 4, p) for p in (0, 6, 11)] == [20, 10, 39]
    assert ex.slot_of([7], 16, 15) == 127


def test_7_1_last_block_waste():
    assert ex.last_block_waste(10, 4) == 2
    assert ex.last_block_waste(12, 4) == 0
    assert ex.last_block_waste(1, 16) == 15


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_7_2_element_offset_matches_the_cache(layout):
    cache = PagedKVCache(1, 5, 4, 3, 8, dtype=torch.float32, device="cpu", layout=layout)
    for slot, head, dim in [(0, 0, 0), (7, 2, 5), (19, 1, 7), (13, 0, 3)]:
        key = torch.zeros(1, 3, 8)
        key[0, head, dim] = 1.0
        cache.storage.zero_()
        cache.write(0, key, key, torch.tensor([slot]))
        flat = cache.key_cache(0).flatten()
        assert flat.nonzero().flatten().tolist() == [ex.element_offset(slot, head, dim, 4, 3, 8, layout)]


def test_7_3_swap_out_reference_equals_the_method():
    gpu = PagedKVCache(2, 6, 2, 2, 4, dtype=torch.float32, device="cpu")
    gpu.storage.normal_()
    ours, theirs = gpu.cpu_pool(3), gpu.cpu_pool(3)
    pairs = [(5, 0), (1, 2)]
    gpu.swap_out(theirs, pairs)
    ex.swap_out_reference(gpu.storage, ours.storage, pairs)
    assert torch.equal(ours.storage, theirs.storage)
    assert ours.storage[:, :, 1].abs().sum() == 0
