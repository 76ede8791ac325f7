"""Chapter 10's recorded numbers (results/*.json): the figures its prose quotes through glue.

The chapter reads these files and glues the values into the text; these checks pin the recorded
runs, so that a re-recorded run that changes what the prose says is noticed and read again.
"""

import json

import pytest

from minipaged.runtime import results_path


def load(name):
    path = results_path(name)
    if not path.exists():
        pytest.skip(f"{name} not recorded")
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def runs():
    policies = load("policies_h200.json")
    by_run = {(r["experiment"], r["run"].split(",")[0].split(" (")[0]): r
              for r in policies["rows"]}
    return policies, by_run


def test_preemption_runs(runs):
    policies, by_run = runs
    assert policies["workload"]["peak_blocks_if_all_ran_at_once"] == 12943
    ref, rec, swp = (by_run["preemption", k] for k in ("no preemption", "recompute", "swap"))
    assert (ref["num_blocks"], rec["num_blocks"], swp["num_blocks"]) == (69467, 4314, 4314)
    assert (ref["steps"], rec["steps"]) == (274, 774)
    assert (ref["preemptions"], rec["preemptions"], swp["preemptions"]) == (0, 79, 97)
    assert [round(r["tok_per_s"]) for r in (ref, rec, swp)] == [13202, 7133, 5775]
    assert round(by_run["preemption_before", "swap"]["tok_per_s"]) == 3820
    assert rec["prefill_tokens"] - rec["prompt_tokens"] == 36172
    assert swp["prefill_tokens"] == swp["prompt_tokens"] == 139649
    assert round(100 * 36172 / 139649) == 26
    assert [round(r["mean_ttft_s"], 1) for r in (rec, swp)] == [2.7, 4.0]
    assert (rec["requests_identical_to_reference"],
            swp["requests_identical_to_reference"]) == (45, 44)
    # the prose says recompute beats swap, and a small cache costs throughput
    assert ref["tok_per_s"] > rec["tok_per_s"] > swp["tok_per_s"]


def test_arrival_runs(runs):
    _, by_run = runs
    dfirst, pfirst = by_run["arrivals", "decode_first"], by_run["arrivals", "prefill_first"]
    assert dfirst["rate_per_s"] == 40
    ms = lambda row: [round(1e3 * row[k], 1) for k in ("mean_ttft_s", "mean_tpot_s", "p90_tpot_s")]
    assert ms(dfirst) == [51.7, 20.2, 27.0]
    assert ms(pfirst) == [46.9, 23.1, 31.5]
    assert round(100 * (pfirst["seconds"] / dfirst["seconds"] - 1)) == 4
    # the prose: prefill-first wins TTFT, decode-first wins TPOT
    assert pfirst["mean_ttft_s"] < dfirst["mean_ttft_s"]
    assert dfirst["mean_tpot_s"] < pfirst["mean_tpot_s"]


def test_swap_copy_run():
    rows = {r["blocks"]: r for r in load("swap_copy_h200.json")["rows"]}
    big = rows[64]
    assert big["identical"]
    assert [round(big[k], 1) for k in ("out_pageable_gb_per_s", "in_pageable_gb_per_s")] == [1.2, 3.4]
    assert [round(big[k]) for k in ("out_minipaged_gb_per_s", "in_minipaged_gb_per_s",
                                    "out_link_gb_per_s")] == [15, 20, 53]
    assert round((big["out_minipaged_us"] + big["in_minipaged_us"]) / 1e3) == 14


def test_scheduler_overhead_run():
    record = load("scheduler_overhead_cpu.json")
    medians = record["comparison"]["median_ms_total"]
    assert round(medians["baseline"]["prefix_caching=False"], 3) == 1.156
    assert round(medians["baseline"]["prefix_caching=True"], 3) == 1.180
    assert round(medians["current"]["prefix_caching=False"], 3) == 0.491
    assert round(medians["current"]["prefix_caching=True"], 3) == 0.589
    for key, before in medians["baseline"].items():
        after = medians["current"][key]
        assert after < 1.0 and after < 0.7 * before, (key, before, after)  # the 1 ms target
