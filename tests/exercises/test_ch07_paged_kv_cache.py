"""Checks for the chapter 7 exercises (exercises/ch07_paged_kv_cache.py)."""

import contextlib

import pytest
import torch
from triton.runtime.jit import KernelInterface

from minipaged.kernels.kv_cache import PagedKVCache
from minipaged.runtime import default_device
from tests.exercises.answers import load

ex = load("ch07_paged_kv_cache")
DEVICE = default_device()


def to_v0(nhd_k: torch.Tensor, nhd_v: torch.Tensor):
    """An NHD layer [blocks, B, H, D] as vLLM's original K [blocks, H, D/x, B, x] and V
    [blocks, H, D, B]."""
    blocks, block_size, heads, head_dim = nhd_k.shape
    x = 16 // nhd_k.element_size()
    k = nhd_k.view(blocks, block_size, heads, head_dim // x, x).permute(0, 2, 3, 1, 4)
    return k.contiguous(), nhd_v.permute(0, 2, 3, 1).contiguous()


@pytest.mark.parametrize("layout", ["NHD", "HND", "V0"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_7_1_element_offset_matches_the_layout(layout, dtype):
    cache = PagedKVCache(1, 5, 4, 3, 16, dtype=dtype, device="cpu",
                         layout="HND" if layout == "HND" else "NHD")
    for slot, head, dim in [(0, 0, 0), (7, 2, 5), (19, 1, 15), (13, 0, 9), (6, 2, 8)]:
        key = torch.zeros(1, 3, 16, dtype=dtype)
        key[0, head, dim] = 1.0
        cache.storage.zero_()
        cache.write(0, key, key, torch.tensor([slot]))
        k = cache.key_cache(0)
        if layout == "V0":
            k, _ = to_v0(k, cache.value_cache(0))
        found = k.flatten().nonzero().flatten().tolist()
        assert found == [ex.element_offset(slot, head, dim, 4, 3, 16, layout,
                                           dtype_bytes=k.element_size())]


# Exercise 7.2: a grader for a writer into the V0 layout, and planted bugs it must reject.

def check_v0_writer(fn):
    for dtype, heads, head_dim, block_size in ((torch.float16, 3, 32, 4),
                                               (torch.float32, 2, 16, 8)):
        gen = torch.Generator().manual_seed(heads)
        ref = PagedKVCache(1, 6, block_size, heads, head_dim, dtype=dtype, device=DEVICE)
        ref.storage.fill_(-7.0)
        n = 11
        slots = torch.randperm(ref.num_slots, generator=gen)[:n]
        slots[::3] = -1
        slots[4] = ref.num_slots + 5                          # out of range: writes nothing
        key = torch.randn(n, heads, head_dim, generator=gen).to(dtype).to(DEVICE)
        value = torch.randn(n, heads, head_dim, generator=gen).to(dtype).to(DEVICE)
        slots = slots.to(DEVICE)
        ref.write(0, key, value, slots, check_slots=False)
        want_k, want_v = to_v0(ref.key_cache(0), ref.value_cache(0))
        got_k, got_v = torch.full_like(want_k, -7.0), torch.full_like(want_v, -7.0)
        fn(got_k, got_v, key, value, slots)
        assert torch.equal(got_k, want_k), f"K differs ({dtype}, D={head_dim})"
        assert torch.equal(got_v, want_v), f"V differs ({dtype}, D={head_dim})"


@contextlib.contextmanager
def triton_launches(swallow: bool):
    """Count the Triton kernel launches ``kernel[grid](...)`` made inside the block; with
    ``swallow``, launch nothing (so only what PyTorch code writes reaches memory)."""
    launches = []
    original = KernelInterface.__getitem__

    def launch(kernel, grid):
        run = original(kernel, grid)

        def counted(*args, **kwargs):
            launches.append(kernel)
            return None if swallow else run(*args, **kwargs)
        return counted

    KernelInterface.__getitem__ = launch
    try:
        yield launches
    finally:
        KernelInterface.__getitem__ = original


def check_writes_in_triton(fn):
    """The writer launches a Triton kernel, and without its launches the caches stay as they were:
    every element it writes is written by a kernel, none by PyTorch indexing."""
    def caches():
        return (torch.full((6, 3, 4, 4, 8), -7.0, dtype=torch.float16, device=DEVICE),
                torch.full((6, 3, 32, 4), -7.0, dtype=torch.float16, device=DEVICE))

    key = torch.randn(5, 3, 32, dtype=torch.float16).to(DEVICE)
    slots = torch.arange(5, device=DEVICE)
    with triton_launches(swallow=False) as launches:
        fn(*caches(), key, key.clone(), slots)
    assert launches, "write_kv_v0 launched no Triton kernel: write it as a @triton.jit kernel"
    k_cache, v_cache = caches()
    with triton_launches(swallow=True):
        fn(k_cache, v_cache, key, key.clone(), slots)
    assert bool((k_cache == -7).all() and (v_cache == -7).all()), \
        "with its Triton launches skipped write_kv_v0 still wrote the cache: the writes must happen " \
        "in the kernel, not in PyTorch code around it"


def test_7_2_write_kv_v0():
    check_v0_writer(ex.write_kv_v0)


def test_7_2_the_writes_happen_in_a_triton_kernel():
    check_writes_in_triton(ex.write_kv_v0)


def planted(k_index, v_index):
    """A PyTorch writer into the V0 layout with the given (possibly wrong) index functions."""
    def fn(key_cache, value_cache, key, value, slots):
        blocks, heads, _, block_size, x = key_cache.shape
        head_dim = value_cache.shape[2]
        for i, slot in enumerate(slots.tolist()):
            if not 0 <= slot < blocks * block_size:
                continue
            b, o = divmod(slot, block_size)
            for h in range(heads):
                for d in range(head_dim):
                    key_cache.view(-1)[k_index(b, o, h, d, heads, head_dim, block_size, x)] = \
                        key[i, h, d]
                    value_cache.view(-1)[v_index(b, o, h, d, heads, head_dim, block_size)] = \
                        value[i, h, d]
    return fn


def k_right(b, o, h, d, H, D, B, x):
    return (((b * H + h) * (D // x) + d // x) * B + o) * x + d % x


def v_right(b, o, h, d, H, D, B):
    return ((b * H + h) * D + d) * B + o


@pytest.mark.parametrize("bug", [
    planted(lambda b, o, h, d, H, D, B, x: (((b * H + h) * B + o) * (D // x) + d // x) * x + d % x,
            v_right),                                             # D/x and B swapped
    planted(k_right, lambda b, o, h, d, H, D, B: ((b * H + h) * B + o) * D + d),  # V as HND
    planted(lambda b, o, h, d, H, D, B, x: ((b * H + h) * B + o) * D + d, v_right),  # K as HND
])
@pytest.mark.grader
def test_7_2_the_grader_rejects_planted_bugs(bug):
    with pytest.raises(AssertionError):
        check_v0_writer(bug)


@pytest.mark.grader
def test_7_2_the_grader_accepts_a_correct_pytorch_writer():
    check_v0_writer(planted(k_right, v_right))


def _nhd_kernel_then_permute(key_cache, value_cache, key, value, slots):
    """Launches the chapter's NHD kernel into a scratch cache, then permutes it with PyTorch."""
    from minipaged.kernels.kv_cache import PagedKVCache as Cache
    blocks, heads, _, block_size, x = key_cache.shape
    scratch = Cache(1, blocks, block_size, heads, value_cache.shape[2], dtype=key_cache.dtype,
                    device=key_cache.device)
    scratch.write(0, key, value, slots, check_slots=False)
    k, v = to_v0(scratch.key_cache(0), scratch.value_cache(0))
    written = (slots >= 0) & (slots < blocks * block_size)
    for slot in slots[written].tolist():      # copy only the written tokens, as a kernel would
        b, o = divmod(slot, block_size)
        key_cache[b, :, :, o] = k[b, :, :, o]
        value_cache[b, :, :, o] = v[b, :, :, o]


@pytest.mark.grader
@pytest.mark.parametrize("writer", [planted(k_right, v_right), _nhd_kernel_then_permute])
def test_7_2_the_grader_rejects_writes_outside_a_kernel(writer):
    with pytest.raises(AssertionError):
        check_writes_in_triton(writer)
