"""Checks for the chapter 8 exercises (exercises/ch08_paged_attention.py)."""

import math
from types import SimpleNamespace

import pytest
import torch

from minipaged.memory.block_table import blocks_needed
from minipaged.kernels.kv_cache import PagedKVCache
from minipaged.runtime import default_device
from tests.exercises.answers import load

ex = load("ch08_paged_attention")
DEVICE = default_device()


# Exercise 8.1: predictions, checked against what a real cache holds. The bytes per token come
# from the storage of a PagedKVCache of that shape, not from a formula.

WEIGHT_BYTES = 1.2e9
QWEN3 = dict(num_layers=28, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16)


def measured_kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype):
    """Bytes of K and V one token holds in a cache of this shape (what a step reads of it)."""
    cache = PagedKVCache(num_layers, 2, 16, num_kv_heads, head_dim, dtype, "cpu")
    return cache.storage.numel() * cache.storage.element_size() / (2 * 16)


def measured_crossovers():
    base = WEIGHT_BYTES / measured_kv_bytes_per_token(**QWEN3)
    changed = {"4 KV heads": {**QWEN3, "num_kv_heads": 4},
               "fp8 cache": {**QWEN3, "dtype": torch.float8_e4m3fn},
               "32 query heads": QWEN3}          # the cache holds no query: same shape
    truth = {"tokens": base, "batch of 64 x 1,000": 64 * 1000 / base}
    truth.update({name: WEIGHT_BYTES / measured_kv_bytes_per_token(**shape) / base
                  for name, shape in changed.items()})
    return truth


def check_crossover_predictions(predicted):
    truth = measured_crossovers()
    assert set(predicted) == set(truth), f"predict exactly these: {sorted(truth)}"
    for name, value in truth.items():
        got = predicted[name]
        assert got is not None and abs(got - value) <= 0.1 * value, (
            f"{name}: you predicted {got}, the cache says {value:.3g}")


def test_8_1_kv_crossover_predictions():
    check_crossover_predictions(ex.kv_crossover_predictions())


_RIGHT_8_1 = {"tokens": 10_463, "batch of 64 x 1,000": 6.12, "4 KV heads": 2.0,
              "fp8 cache": 2.0, "32 query heads": 1.0}


@pytest.mark.grader
def test_8_1_the_check_accepts_right_predictions():
    check_crossover_predictions(_RIGHT_8_1)


@pytest.mark.parametrize("wrong", [
    {"tokens": 20_926, "batch of 64 x 1,000": 3.06},    # K only, V forgotten
    {"tokens": 374, "batch of 64 x 1,000": 171.0},      # one layer's tokens times 28 forgotten
    {"32 query heads": 0.5},                            # query heads read K/V again
    {"fp8 cache": 0.5},                                 # the wrong way round
])
@pytest.mark.grader
def test_8_1_the_check_rejects_wrong_predictions(wrong):
    with pytest.raises(AssertionError):
        check_crossover_predictions({**_RIGHT_8_1, **wrong})


# Exercise 8.2: the tile plan, checked tile by tile: a plan that loads a tile lying wholly before
# the window (or starts at 0, or one tile early) fails, as does one that misses a position or
# breaks the alignment. Then the kernel, against a reference: positions before each window hold
# NaN, so a kernel that reads them (a missing lower mask, an unmasked V load) fails.

def check_tile_plan(plan):
    for tile in (1, 4, 16, 64):
        for window in (1, 5, 16, 33, 64, 1000):
            for length in range(0, 200, 7):
                starts = plan(length, window, tile)
                lo = max(0, length - window)
                where = f"length {length}, window {window}, tile {tile}: tiles at {starts}"
                assert list(starts) == sorted(set(starts)), f"{where}: in order, each once"
                for s in starts:
                    assert s % tile == 0, f"{where}: tile {s} is not aligned"
                    assert s + tile > lo, f"{where}: tile {s} lies wholly before the window"
                    assert s < length, f"{where}: tile {s} lies wholly past the end"
                covered = {p for s in starts for p in range(s, s + tile)}
                missed = sorted(set(range(lo, length)) - covered)
                assert not missed, f"{where}: position {missed[0]} is in no tile"


def test_8_2_tile_plan():
    check_tile_plan(ex.window_tile_starts)


PLANTED_PLANS = {
    "from position 0": lambda n, w, t: list(range(0, n, t)),
    "one tile early": lambda n, w, t: list(range(max(0, (max(0, n - w) // t - 1) * t), n, t)),
    "unaligned": lambda n, w, t: list(range(max(0, n - w), n, t)),
    "last tile missed": lambda n, w, t: list(range(max(0, n - w) // t * t, n - t + 1, t)),
}


@pytest.mark.parametrize("name", PLANTED_PLANS)
@pytest.mark.grader
def test_8_2_the_plan_check_rejects_planted_bugs(name):
    with pytest.raises(AssertionError):
        check_tile_plan(PLANTED_PLANS[name])

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


def positions_reference(query, cache, tables, lens, positions_of):
    """Attention of each sequence over the positions ``positions_of(n)`` (none: zeros)."""
    out = torch.zeros(query.shape, dtype=torch.float32, device=query.device)
    for b in range(query.shape[0]):
        n = int(lens[b])
        keep = list(positions_of(n))
        if not keep:
            continue
        k, v = cache.gather(0, tables[b, :blocks_needed(n, cache.block_size)], n)
        k, v = (x[keep].float().repeat_interleave(2, dim=1) for x in (k, v))
        p = (torch.einsum("hd,thd->ht", query[b].float(), k) / math.sqrt(32)).softmax(-1)
        out[b] = torch.einsum("ht,thd->hd", p, v)
    return out


def window_reference(query, cache, tables, lens, lo_of):
    return positions_reference(query, cache, tables, lens, lambda n: range(lo_of(n), n))


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


# The kernel must walk the plan it is graded on: with wrong plans put in the place of
# window_tile_starts (the module attribute the answer calls), a plan without a sequence's first or
# last tile must change the answer. A kernel that computes its own tiles passes check_window and
# fails this check; with the plan graded by check_tile_plan, a kernel that passes both never
# loads a tile wholly before the window.

def check_kernel_walks_the_plan(fn, plans):
    real = plans.window_tile_starts
    calls = []
    window = 33
    query, cache, tables, lens = window_case(16, seed=7)
    ref = window_reference(query, cache, tables, lens, lambda n: max(0, n - window))

    def run(plan):
        plans.window_tile_starts = plan
        out = fn(query, cache, 0, tables, lens, window).float()
        return ((out - ref).norm() / ref.norm()).item()

    try:
        run(lambda n, w, t: calls.append((n, w)) or real(n, w, t))
        missing = {(n, window) for n in lens.tolist()} - set(calls)
        assert not missing, ("call window_tile_starts(L, window, TILE) for every sequence; "
                             f"not called for (L, window) in {sorted(missing)}")
        for name, plan in (("without its first tile", lambda n, w, t: real(n, w, t)[1:]),
                           ("without its last tile", lambda n, w, t: real(n, w, t)[:-1])):
            assert not run(plan) < 1e-2, (
                f"with each sequence's plan {name}, the answer stays right: the kernel "
                "does not walk the tiles of window_tile_starts")
    finally:
        plans.window_tile_starts = real


def test_8_2_the_kernel_walks_the_plan():
    check_kernel_walks_the_plan(ex.sliding_window_attention, ex)


def _right_plan(length, window, tile):
    lo = max(0, length - window)
    return list(range(lo - lo % tile, length, tile))


def plan_walker(masked=True, tile=16):
    """An answer in torch that attends over the tiles of ``window_tile_starts`` (looked up
    in its namespace at each call, as an answer's module does), masked to the window."""
    plans = SimpleNamespace(window_tile_starts=_right_plan)

    def fn(query, cache, layer, tables, lens, window):
        def positions(n):
            starts = plans.window_tile_starts(n, window, tile)
            covered = sorted({p for s in starts for p in range(s, min(s + tile, n))})
            return [p for p in covered if p >= max(0, n - window) or not masked]
        return positions_reference(query, cache, tables, lens, positions).half()

    return fn, plans


@pytest.mark.grader
def test_8_2_the_plan_walk_check_passes_a_correct_answer():
    check_window(plan_walker()[0])
    check_kernel_walks_the_plan(*plan_walker())


@pytest.mark.grader
def test_8_2_the_window_check_rejects_a_walker_without_the_lower_mask():
    with pytest.raises(AssertionError):
        check_window(plan_walker(masked=False)[0])


def _ignores_the_plan():
    """Calls the plan, then attends over the window it computes itself."""
    plans = SimpleNamespace(window_tile_starts=_right_plan)

    def fn(query, cache, layer, tables, lens, window):
        for n in lens.tolist():
            plans.window_tile_starts(n, window, 16)
        return window_reference(query, cache, tables, lens, lambda n: max(0, n - window)).half()

    return fn, plans


@pytest.mark.parametrize("answer", [_ignores_the_plan, lambda: (plan_walker()[0], SimpleNamespace(
                                        window_tile_starts=_right_plan))])
@pytest.mark.grader
def test_8_2_the_plan_walk_check_rejects_planted_bugs(answer):
    """Tiles of its own after calling the plan; a plan that is not the module's."""
    with pytest.raises(AssertionError):
        check_kernel_walks_the_plan(*answer())


@pytest.mark.parametrize("bug", [
    planted(lambda n, w: max(0, n - w - 1)),             # one token too many
    planted(lambda n, w: max(0, n - w + 1)),             # one token too few
    planted(lambda n, w: 0),                             # no window at all
])
@pytest.mark.grader
def test_8_2_the_grader_rejects_planted_bugs(bug):
    with pytest.raises(AssertionError):
        check_window(bug)
