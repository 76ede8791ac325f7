"""Checks for the chapter 14 exercises (exercises/ch14_fast_engine.py)."""

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged.kernels.fused_ops import add_rms_norm_reference  # before triton: the interpreter switch
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from minipaged.runtime import results_path  # noqa: E402
from tests.exercises.answers import load

ex = load("ch14_fast_engine")


# -- 13.1: a fused RMSNorm for any hidden size, graded with planted bugs ---------------------

def grade_rms_norm(fn, sizes=((1, 48), (3, 100), (2, 64), (4, 7), (2, 1))):
    """Raise AssertionError unless ``fn(x, weight, eps)`` is RMSNorm of every row of ``x``."""
    gen = torch.Generator().manual_seed(0)
    for dtype, tol in ((torch.float32, 1e-5), (torch.float16, 2e-3)):
        for n, hidden in sizes:
            x = torch.randn(n, hidden, generator=gen).to(dtype)
            w = torch.randn(hidden, generator=gen).to(dtype)
            for eps in (1e-6, 1.0):
                want = add_rms_norm_reference(x, None, w, eps)[0]
                got = fn(x, w, eps)
                assert got.shape == want.shape and got.dtype == dtype, "shape or dtype"
                error = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
                assert error < tol, f"{dtype} [{n}, {hidden}] eps {eps}: error {error:.1e}"
    big = torch.full((2, sizes[0][1]), 400.0, dtype=torch.float16)   # 400 * 400 > 65,504
    ones = torch.ones(sizes[0][1], dtype=torch.float16)
    got = fn(big, ones, 1e-6)
    assert torch.allclose(got.float(), torch.ones_like(got.float()), atol=1e-2), \
        "large fp16 values: the statistics overflow"


@triton.jit
def _planted_kernel(x_ptr, w_ptr, out_ptr, eps, HIDDEN: tl.constexpr, BLOCK: tl.constexpr,
                    BUG: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < HIDDEN
    x = tl.load(x_ptr + row * HIDDEN + cols, mask=mask, other=0.0)
    s = x.to(tl.float32) if BUG != 3 else x                  # 3: statistics in the input dtype
    total = tl.sum(s * s, axis=0).to(tl.float32)
    mean = total / BLOCK if BUG == 1 else total / HIDDEN     # 1: mean over the padded width
    if BUG == 2:
        rstd = 1.0 / (tl.sqrt(mean) + eps)                   # 2: epsilon outside the root
    else:
        rstd = 1.0 / tl.sqrt(mean + eps)
    normed = (x.to(tl.float32) * rstd).to(x.dtype).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * HIDDEN + cols, (normed * w).to(x.dtype), mask=mask)


def planted(bug):
    def fn(x, weight, eps):
        x = x.contiguous()
        out = torch.empty_like(x)
        _planted_kernel[(x.shape[0],)](x, weight, out, eps, HIDDEN=x.shape[1],
                                       BLOCK=triton.next_power_of_2(x.shape[1]), BUG=bug)
        return out
    return fn


def test_13_1_rms_norm():
    grade_rms_norm(ex.rms_norm)


@pytest.mark.grader
def test_13_1_the_grader_passes_a_correct_kernel():
    grade_rms_norm(planted(0))


@pytest.mark.parametrize("bug", [1, 2, 3])
@pytest.mark.grader
def test_13_1_the_grader_rejects_planted_bugs(bug):
    with pytest.raises(AssertionError):
        grade_rms_norm(planted(bug))


@pytest.mark.grader
def test_13_1_a_padded_mean_hides_at_power_of_two_sizes():
    grade_rms_norm(planted(1), sizes=((2, 64), (3, 16)))    # why the grader uses odd sizes


# -- 13.2: predictions of what fusion can win, against the recorded profile of chapter 12 -------

def fusion_truth():
    """The three answers of exercise 14.2, from the record the chapter's table shows."""
    window = json.loads(results_path("engine_profile_h200.json").read_text())["window"]
    rows = {row["class"]: row for row in window["classes"]}
    total, host = window["gpu_us_per_step"], window["host_us_per_step"]
    free = total - rows["glue"]["gpu_us_per_step"] - rows["copies"]["gpu_us_per_step"]
    above = {name: rows[name]["gpu_us_per_step"] - rows[name]["floor_us_per_step"]
             for name in ("attention", "GEMM")}
    above["host"] = host
    return {"GPU ms with free glue": free / 1e3,
            "step speed-up at most": (total + host) / (free + host),
            "next": max(above, key=above.get)}


def check_fusion_predictions(predicted):
    truth = fusion_truth()
    assert set(predicted) == set(truth), f"predict exactly these: {sorted(truth)}"
    assert predicted["next"] == truth["next"], (
        f"next: you predicted {predicted['next']!r}; compare each part's time above its floor, "
        "the host's included")
    for name in ("GPU ms with free glue", "step speed-up at most"):
        got, value = predicted[name], truth[name]
        assert got is not None and abs(got - value) <= 0.05 * value, (
            f"{name}: you predicted {got}, the profile gives {value:.3g}")


def test_13_2_fusion_predictions():
    check_fusion_predictions(ex.fusion_predictions())


@pytest.mark.grader
def test_13_2_the_check_accepts_right_predictions():
    check_fusion_predictions(fusion_truth())


def _wrong_13_2():
    """Predictions with one usual mistake each, computed from the same record."""
    window = json.loads(results_path("engine_profile_h200.json").read_text())["window"]
    rows = {row["class"]: row for row in window["classes"]}
    total = window["gpu_us_per_step"]
    truth = fusion_truth()
    only_glue = total - rows["glue"]["gpu_us_per_step"]
    return {
        "copies kept": {"GPU ms with free glue": only_glue / 1e3},
        "host left out of the step":
            {"step speed-up at most": total / (1e3 * truth["GPU ms with free glue"])},
        "host forgotten": {"next": "GEMM"},
        "floors ignored": {"next": "attention"},
    }


@pytest.mark.parametrize("mistake", ["copies kept", "host left out of the step", "host forgotten",
                                     "floors ignored"])
@pytest.mark.grader
def test_13_2_the_check_rejects_wrong_predictions(mistake):
    with pytest.raises(AssertionError):
        check_fusion_predictions({**fusion_truth(), **_wrong_13_2()[mistake]})


# -- 13.3: how long a batch of programs keeps the card busy ---------------------------------------

def test_13_3_makespan():
    assert ex.makespan([5, 5, 5, 5], 2) == 10
    assert ex.makespan([], 3) == 0
    assert ex.makespan([3, 7], 5) == 7, "more slots than programs: the longest one"
    assert ex.makespan([1, 1, 1, 1, 10], 2) == 12, "the long program starts last"
    assert ex.makespan([10, 1, 1, 1, 1, 1], 2) == 10, \
        "a free slot takes the next program (not program i on slot i % slots)"


@settings(max_examples=100, deadline=None)
@given(loads=st.lists(st.integers(0, 1000), max_size=60), slots=st.integers(1, 16))
def test_13_3_makespan_lies_within_the_list_scheduling_bounds(loads, slots):
    got = ex.makespan(loads, slots)
    longest, mean = max(loads, default=0), sum(loads) / slots
    assert max(longest, mean) <= got <= mean + longest
