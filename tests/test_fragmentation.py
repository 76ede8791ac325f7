"""Chapter 2: workloads, the first-fit allocator, the simulator's invariants; and the appendix's
trace reader and command line (minipaged.book.trace)."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged.book.fragmentation import (POLICIES, WORKLOADS, FirstFitAllocator, TraceRequest,
                                          clipped_lognormal_mean, fit_lognormal_mu,
                                          generate_workload, reservation_tokens, simulate)
from minipaged.book.trace import TraceFormatError, read_trace_csv

STATES = ("token_states", "reservation", "internal", "external", "headroom", "blocked", "free")


@pytest.fixture(scope="module")
def sharegpt_runs():
    requests = generate_workload("sharegpt", 300, seed=11)
    return requests, {p: simulate(requests, p, 16384, block_size=16, max_len=2048) for p in POLICIES}


def test_shares_account_for_the_whole_budget(sharegpt_runs):
    requests, runs = sharegpt_runs
    for policy, run in runs.items():
        shares = run.shares()
        assert sum(shares.values()) <= 1 + 1e-9 and sum(shares.values()) == pytest.approx(1)
        assert all(v >= 0 for v in shares.values()), policy
        per_step = sum(getattr(run, s) for s in STATES)
        assert (per_step == 16384).all(), policy
        assert run.generated_tokens == sum(r.output_len for r in requests), policy


def test_policy_order_matches_the_paper(sharegpt_runs):
    _, runs = sharegpt_runs
    tokens = {p: run.shares()["token_states"] for p, run in runs.items()}
    assert tokens["paged"] > tokens["oracle"] >= tokens["pow2"] >= tokens["max"]
    assert tokens["paged"] > 0.9 and tokens["max"] < 0.35


def test_which_waste_each_policy_has(sharegpt_runs):
    _, runs = sharegpt_runs
    assert (runs["oracle"].internal == 0).all()            # reserves exactly the final length
    assert (runs["max"].external == 0).all()               # equal regions never fragment
    assert (runs["max"].running <= 16384 // 2048).all()
    paged = runs["paged"]
    assert (paged.internal + paged.reservation < 16 * np.maximum(paged.running, 1)).all()


def test_single_request_by_hand():
    run = simulate([TraceRequest(0, 100, 300)], "max", budget_tokens=2048, max_len=2048)
    assert len(run.steps) == 301
    assert run.token_states.tolist() == list(range(100, 401))
    assert (run.reservation + run.token_states == 400).all() and (run.internal == 1648).all()


def test_paging_preempts_and_still_finishes_everything():
    requests = [TraceRequest(0, 20, 60) for _ in range(6)]
    run = simulate(requests, "paged", budget_tokens=160, block_size=8, max_len=100)
    assert run.preemptions > 0
    assert run.generated_tokens == 6 * 60 and run.running[-1] >= 1
    assert (sum(getattr(run, s) for s in STATES) == 160).all()


def test_idle_gaps_between_arrivals_are_skipped():
    requests = [TraceRequest(0, 4, 4), TraceRequest(1000, 4, 4)]
    run = simulate(requests, "oracle", budget_tokens=64, max_len=64)
    assert len(run.steps) == 10 and run.steps[-1] == 1004 and run.generated_tokens == 8


def test_truncation_and_budget_errors():
    run = simulate([TraceRequest(0, 50, 100)], "paged", 256, block_size=16, max_len=64)
    assert run.truncated == 1 and run.token_states.max() == 64
    with pytest.raises(ValueError, match="raise budget_tokens"):
        simulate([TraceRequest(0, 10, 10)], "max", budget_tokens=1000, max_len=2048)
    with pytest.raises(ValueError, match="unknown policy"):
        simulate([], "lifo", 100)
    with pytest.raises(ValueError, match="contiguous"):
        reservation_tokens("paged", 10, 2048)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_workload_means_and_limits(name):
    spec = WORKLOADS[name]
    mu = fit_lognormal_mu(spec.prompt_mean, spec.prompt_sigma, 2047)
    assert clipped_lognormal_mean(mu, spec.prompt_sigma, 2047) == pytest.approx(spec.prompt_mean)
    requests = generate_workload(name, 20_000, seed=5, max_len=2048)
    assert np.mean([r.output_len for r in requests]) == pytest.approx(spec.output_mean, rel=0.04)
    assert all(r.prompt_len >= 1 and r.total_len <= 2048 for r in requests)
    arrivals = np.array([r.arrival for r in requests])
    assert (np.diff(arrivals) >= 0).all() and np.mean(np.diff(arrivals)) == pytest.approx(1.0, rel=0.05)
    assert generate_workload(name, 50, seed=5) == generate_workload(name, 50, seed=5)
    assert generate_workload(name, 50, seed=5) != generate_workload(name, 50, seed=6)
    with pytest.raises(ValueError, match="unknown workload"):
        generate_workload("sharegtp", 5)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 12)), max_size=60))
def test_first_fit_keeps_the_space_partitioned(operations):
    heap = FirstFitAllocator(48)
    live = {}
    for allocate, size in operations:
        if allocate or not live:
            start = heap.allocate(size)
            if start is None:
                assert heap.largest_hole() < size
                continue
            live[start] = size
        else:
            start = sorted(live)[size % len(live)]
            heap.free(start)
            del live[start]
        pieces = sorted([(s, n, "used") for s, n in live.items()] + [(s, n, "free") for s, n in heap.holes()])
        position = 0
        for (start, n, kind), following in zip(pieces, pieces[1:] + [None]):
            assert start == position and n > 0          # no gap, no overlap
            position += n
            if kind == "free" and following is not None:
                assert following[2] == "used"            # neighbouring holes are merged
        assert position == 48 and heap.free_tokens == 48 - sum(live.values())
    with pytest.raises(ValueError, match="double free"):
        heap.free(999)


def test_read_trace_csv_column_names(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("Request ID,Input Tokens,Completion Tokens,arrival\nr1,12,3,0\nr2,5,0,2.5\n")
    requests = read_trace_csv(path)
    assert requests == [TraceRequest(0.0, 12, 3), TraceRequest(2.5, 5, 0)]
    path.write_text("a,b\n4,5\n")
    assert read_trace_csv(path, prompt_column="a", output_column="b", rate=None) == [TraceRequest(0.0, 4, 5)]
    with pytest.raises(TraceFormatError, match="no prompt column"):
        read_trace_csv(path)
    path.write_text("prompt_len,output_len\n4,five\n")
    with pytest.raises(TraceFormatError, match="line 2"):
        read_trace_csv(path)
    path.write_text("prompt_len,output_len\n0,3\n")
    with pytest.raises(TraceFormatError, match="prompt >= 1"):
        read_trace_csv(path)


WRITER = textwrap.dedent("""
    import csv
    import sys
    import numpy as np
    rng = np.random.default_rng(2024)
    n = 400
    inputs = rng.integers(1, 900, n)
    outputs = rng.geometric(1 / 250, n).clip(max=1000)
    with open(sys.argv[1], "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["conversation", "Num Input Tokens", "Num Output Tokens"])
        writer.writerows((f"c{i}", int(a), int(b)) for i, (a, b) in enumerate(zip(inputs, outputs)))
""")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "minipaged.book.trace", *args],
                          capture_output=True, text=True, timeout=120)


def test_cli_on_a_csv_written_by_another_process(tmp_path):
    path = tmp_path / "other.csv"
    subprocess.run([sys.executable, "-c", WRITER, str(path)], check=True, timeout=120)
    results = {}
    for policy in POLICIES:
        done = _cli("--trace", str(path), "--policy", policy, "--budget-tokens", "8192",
                    "--block-size", "16", "--max-len", "2048")
        assert done.returncode == 0, done.stderr
        lines = done.stdout.strip().splitlines()
        assert len(lines) == 1
        results[policy] = json.loads(lines[0])
    for policy, answer in results.items():
        assert answer["policy"] == policy and answer["requests"] == 400
        assert sum(answer[k] for k in STATES) == pytest.approx(1, abs=1e-4)
        assert answer["mean_running"] > 0
    assert results["paged"]["token_states"] > results["oracle"]["token_states"] > results["max"]["token_states"]


def test_cli_generated_workload_and_errors(tmp_path):
    done = _cli("--workload", "alpaca", "--seed", "4", "--num-requests", "100", "--policy", "oracle")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["requests"] == 100
    bad = tmp_path / "bad.csv"
    bad.write_text("x,y\n1,2\n")
    done = _cli("--trace", str(bad))
    assert done.returncode == 2 and "no prompt column" in done.stderr and not done.stdout
    done = _cli("--workload", "alpaca", "--policy", "max", "--budget-tokens", "100")
    assert done.returncode == 2 and "raise budget_tokens" in done.stderr


def test_max_running_caps_concurrency_without_counting_waste():
    requests = generate_workload("alpaca", 200, seed=2, rate=None)
    run = simulate(requests, "paged", 16384, block_size=16, max_running=5)
    assert run.running.max() == 5 and (run.waiting[:10] > 0).all()
    assert (run.external == 0).all()          # waiting for a batch slot, not for memory
    assert run.generated_tokens == sum(r.output_len for r in requests)
    with pytest.raises(ValueError, match="max_running"):
        simulate(requests, "paged", 16384, max_running=0)


def test_idle_memory_is_named_by_its_reason(sharegpt_runs):
    """Free slots while a request waits: holes (contiguous only), watermark, or too few."""
    _, runs = sharegpt_runs
    paged = runs["paged"]
    assert (paged.external == 0).all()                       # any free block fits any prompt
    assert paged.headroom.max() <= int(0.01 * 16384 // 16) * 16  # at most the watermark
    for policy in ("max", "pow2", "oracle"):
        assert (runs[policy].headroom == 0).all(), policy    # no watermark without paging
    assert runs["oracle"].external.mean() > runs["oracle"].blocked.mean()  # real holes


def test_external_means_the_free_slots_would_fit_in_one_piece():
    # oracle, 12 slots: A (0-2), B (3-8), C (9-11); D needs 5. A and C finish at step 1,
    # leaving two holes of 3 around B: 6 free slots, enough for D, but not in one piece.
    requests = [TraceRequest(0, 2, 1), TraceRequest(0, 2, 4), TraceRequest(0, 2, 1),
                TraceRequest(0, 4, 1)]
    run = simulate(requests, "oracle", budget_tokens=12, max_len=12)
    assert run.external.tolist() == [0, 0, 6, 6, 6, 0, 0] and (run.blocked == 0).all()
    assert run.free.tolist() == [0, 0, 0, 0, 0, 7, 7]


def test_blocked_means_too_few_free_slots_in_total():
    # oracle, 12 slots: A (6) finishes first, B (6) runs on; C needs 8 > 6 free: blocked.
    requests = [TraceRequest(0, 5, 1), TraceRequest(0, 2, 6), TraceRequest(0, 7, 1)]
    run = simulate(requests, "oracle", budget_tokens=12, max_len=12)
    assert (run.external == 0).all() and run.blocked.max() == 6
    assert run.generated_tokens == 8
