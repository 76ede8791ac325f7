"""Checks for the chapter 11 exercises (exercises/ch11_model_runner.py)."""

import random

import pytest

from minipaged.memory.block_table import blocks_needed as _blocks_for
from minipaged.memory.sharing import SharingBlockManager
from tests.exercises.answers import load

ex = load("ch11_model_runner")


# -- 11.1: the learner's check must pass a correct top-p and fail five planted bugs ------------

def _ranked(probs):
    return sorted(range(len(probs)), key=lambda t: (-probs[t], t))


def _top_p(probs, top_p):
    """top-p's rule, written here: keep a token while the mass ranked before it is below top_p."""
    kept, mass = set(), 0.0
    for t in _ranked(probs):
        if kept and mass >= top_p:
            break
        kept.add(t)
        mass += probs[t]
    return kept


def _at_or_below(probs, top_p):
    """Bug: keeps a token while the mass before it is at most top_p."""
    kept, mass = set(), 0.0
    for t in _ranked(probs):
        if kept and mass > top_p:
            break
        kept.add(t)
        mass += probs[t]
    return kept


def _inclusive(probs, top_p):
    """Bug: keeps a token only if the mass up to and including it stays within top_p (the
    top token included: the set is never empty)."""
    kept, mass = set(), 0.0
    for t in _ranked(probs):
        mass += probs[t]
        if kept and mass > top_p:
            break
        kept.add(t)
    return kept


def _by_id(probs, top_p):
    """Bug: adds up the mass in token-id order, not from the most likely token down."""
    kept, mass = set(), 0.0
    for t in range(len(probs)):
        if kept and mass >= top_p:
            break
        kept.add(t)
        mass += probs[t]
    return kept


def _ascending(probs, top_p):
    """Bug: ranks from the least likely token up."""
    kept, mass = set(), 0.0
    for t in sorted(range(len(probs)), key=lambda t: (probs[t], t)):
        if kept and mass >= top_p:
            break
        kept.add(t)
        mass += probs[t]
    return kept


def _share_of_vocabulary(probs, top_p):
    """Bug: keeps the round(top_p x V) most likely tokens (a top-k in disguise)."""
    return set(_ranked(probs)[:max(1, round(top_p * len(probs)))])


PLANTED_11_1 = [_at_or_below, _inclusive, _by_id, _ascending, _share_of_vocabulary]


def test_11_1_check_top_p():
    ex.check_top_p(_top_p)                       # a correct top-p passes your check
    for bug in PLANTED_11_1:
        with pytest.raises(AssertionError):
            ex.check_top_p(bug)


# -- 11.2: roofline predictions, against the count of the bytes a step reads -----------------

WEIGHTS, KV_PER_TOKEN, BANDWIDTH = 1.19e9, 114_688, 4.29e12


def _roofline(batch, context):
    return batch * BANDWIDTH / (WEIGHTS + batch * context * KV_PER_TOKEN)


def roofline_truth():
    batch = 1
    while batch * 800 * KV_PER_TOKEN <= WEIGHTS:
        batch += 1
    return {"batch 1": _roofline(1, 800), "batch 256": _roofline(256, 800),
            "batch 256 at context 1,600": _roofline(256, 1600), "KV outweighs weights": batch}


def check_roofline_predictions(predicted):
    truth = roofline_truth()
    assert set(predicted) == set(truth), f"predict exactly these: {sorted(truth)}"
    for name, value in truth.items():
        got = predicted[name]
        assert got is not None and abs(got - value) <= 0.05 * value, (
            f"{name}: you predicted {got}, the roofline gives {value:.4g}")


def test_11_2_roofline_predictions():
    check_roofline_predictions(ex.roofline_predictions())


_RIGHT_11_2 = {"batch 1": 3350, "batch 256": 44_500, "batch 256 at context 1,600": 22_800,
               "KV outweighs weights": 13}


@pytest.mark.grader
def test_11_2_the_check_accepts_right_predictions():
    check_roofline_predictions(_RIGHT_11_2)


@pytest.mark.parametrize("wrong", [
    {"batch 256": 256 * 3350},                   # batching as if weights were read per sequence
    {"batch 256 at context 1,600": 44_500},      # context does not matter
    {"batch 1": 3605},                           # the KV of a lone sequence left out
    {"KV outweighs weights": 1},
])
@pytest.mark.grader
def test_11_2_the_check_rejects_wrong_predictions(wrong):
    with pytest.raises(AssertionError):
        check_roofline_predictions({**_RIGHT_11_2, **wrong})


# -- 11.3: latency predictions, against a simulation of the exercise's timeline --------------

ARRIVALS = {"A": 0.0, "B": 15.0, "C": 45.0}
TOKENS, PREFILL_MS, DECODE_MS = 6, 40.0, 10.0


def simulate_latencies(policy):
    """{request: (TTFT, TPOT)} in ms, stepping the exercise's engine."""
    times = {r: [] for r in ARRIVALS}
    waiting = sorted(ARRIVALS, key=ARRIVALS.get)
    running, now = [], 0.0
    while waiting or running:
        arrived = [r for r in waiting if ARRIVALS[r] <= now]
        if not arrived and not running:
            now = ARRIVALS[waiting[0]]
            continue
        if arrived:
            new = arrived[0]
            waiting.remove(new)
            decoding = running if policy == "mixed" else []
            now += PREFILL_MS
            for r in decoding + [new]:
                times[r].append(now)
            running.append(new)
        else:
            now += DECODE_MS
            for r in running:
                times[r].append(now)
        running = [r for r in running if len(times[r]) < TOKENS]
    return {r: (t[0] - ARRIVALS[r], (t[-1] - t[0]) / (len(t) - 1)) for r, t in times.items()}


def check_latency_predictions(predicted):
    for policy in ("prefill first", "mixed"):
        assert policy in predicted, f"predict the policy {policy!r}"
        truth = simulate_latencies(policy)
        assert set(predicted[policy]) == set(truth), f"{policy}: predict {sorted(truth)}"
        for r, (ttft, tpot) in truth.items():
            got = tuple(predicted[policy][r])
            assert got == pytest.approx((ttft, tpot)), (
                f"{policy}, request {r}: you predicted (TTFT, TPOT) = {got}, "
                f"the timeline gives ({ttft:g}, {tpot:g}) ms")


def test_11_3_latency_predictions():
    check_latency_predictions(ex.latency_predictions())


_RIGHT_11_3 = {"prefill first": {"A": (40, 26), "B": (65, 18), "C": (75, 10)},
               "mixed": {"A": (40, 22), "B": (65, 16), "C": (75, 10)}}


@pytest.mark.grader
def test_11_3_the_check_accepts_right_predictions():
    check_latency_predictions(_RIGHT_11_3)


@pytest.mark.parametrize("policy,request_,wrong", [
    ("prefill first", "B", (40, 18)),            # TTFT from the step it started, not arrival
    ("prefill first", "A", (40, 10)),            # TPOT as the decode step's length
    ("mixed", "A", (40, 110 / 6)),               # the gaps divided by the tokens, not the gaps
])
@pytest.mark.grader
def test_11_3_the_check_rejects_wrong_predictions(policy, request_, wrong):
    predicted = {p: dict(v) for p, v in _RIGHT_11_3.items()}
    predicted[policy][request_] = wrong
    with pytest.raises(AssertionError):
        check_latency_predictions(predicted)


# -- 11.4: speculative decoding's bookkeeping, graded by the manager's own invariant check ----
#
# Sequences (some forked, so blocks are shared) run verification steps with random drafts and
# acceptances. After every step the manager must hold exactly the expected lengths with its
# invariants intact (``inconsistency_with``), every kept token must still sit in the slot the
# forward wrote it to, and a failing forward must leave the manager exactly as it was.



class _ForwardFailed(Exception):
    pass


def _manager_state(m):
    ids = sorted(m.seq_ids(), key=str)
    return ({s: (m.sequence_length(s), list(m.block_table(s))) for s in ids},
            [m.refcount(b) for b in range(m.num_physical_blocks)], m.num_free_blocks)


def _slot(m, seq_id, position):
    return m.block_table(seq_id)[position // m.block_size] * m.block_size + position % m.block_size


def grade_speculative(manager_cls, step, seeds=range(6)):
    for seed in seeds:
        rng = random.Random(seed)
        block_size = rng.choice([2, 4, 8])
        m = manager_cls(64, block_size)
        lengths, written = {}, {}         # written: seq -> {position: slot the forward used}
        for i in range(3):
            m.create_sequence(i)
            m.append_tokens(i, rng.randint(1, 3 * block_size))
            lengths[i] = m.sequence_length(i)
        for parent, child in ((0, 10), (1, 11)):    # forks share every block, the last too
            m.fork(parent, child)
            lengths[child] = lengths[parent]
        for number in range(12):
            ids = rng.sample(sorted(lengths), rng.randint(1, len(lengths)))
            drafts = {s: rng.randint(0, 4) for s in ids}
            accepted = {s: rng.randint(0, k) for s, k in drafts.items()}
            fail = number % 5 == 4
            seen = {}

            def verify(reservation):
                start = 0
                for s, n in zip(reservation.seq_ids, reservation.num_new_tokens):
                    seen[s] = reservation.slot_mapping[start:start + n].tolist()
                    start += n
                if fail:
                    raise _ForwardFailed("the forward failed")
                return accepted

            before = _manager_state(m)
            if fail:
                with pytest.raises(_ForwardFailed):
                    step(m, drafts, verify)
                assert m.pending_step is None, "a failed forward left its step pending"
                assert _manager_state(m) == before, "a failed forward changed the manager"
                continue
            kept = step(m, drafts, verify)
            for s in ids:
                assert list(seen[s]) and len(seen[s]) == drafts[s] + 1, (
                    f"sequence {s!r}: reserve its pending token and its {drafts[s]} drafts")
                start = lengths[s]
                lengths[s] += accepted[s] + 1
                written[s] = {start + j: slot for j, slot in
                              enumerate(seen[s][:accepted[s] + 1])}
            problem = m.inconsistency_with(lengths)
            assert problem is None, f"seed {seed}, step {number}: {problem}"
            for s in ids:
                assert list(kept[s]) == list(written[s].values()), (
                    f"sequence {s!r}: the kept slots are not those the forward wrote")
                for position, slot in written[s].items():
                    assert _slot(m, s, position) == slot, (
                        f"seed {seed}, step {number}: sequence {s!r} maps position {position} "
                        f"to slot {_slot(m, s, position)}, the forward wrote it to {slot}")
        for s in list(lengths):
            m.release_sequence(s)
        assert m.inconsistency_with({}) is None
        assert m.num_free_blocks == 64, "blocks leaked"
    # The tail of a sequence whose blocks another sequence still holds
    m = manager_cls(16, 4)
    m.create_sequence("A")
    m.append_tokens("A", 10)
    m.fork("A", "B")
    m.roll_back_tokens("A", 6)                       # A keeps one block, B all three
    problem = m.inconsistency_with({"A": 4, "B": 10})
    assert problem is None, f"rolling back a shared tail: {problem}"
    assert m.num_free_blocks == 13, "a block another sequence holds went back to the free list"


def test_11_4_speculative_bookkeeping():
    grade_speculative(ex.SpeculativeBlockManager, ex.speculative_step)


class _RollBack(SharingBlockManager):
    """A correct roll-back; the planted bugs below change one detail."""

    def roll_back_tokens(self, seq_id, num_tokens):
        state = self._state(seq_id)
        state.length -= num_tokens
        keep = _blocks_for(state.length, self.block_size)
        dropped = state.block_table[keep:]
        del state.block_table[keep:]
        self.give_back(dropped, seq_id)

    def give_back(self, blocks, seq_id):
        for block in reversed(blocks):
            self._drop_block(block, seq_id)


class _KeepsBlocks(_RollBack):
    """Bug: the length drops, the table keeps its blocks (they leak)."""

    def roll_back_tokens(self, seq_id, num_tokens):
        self._state(seq_id).length -= num_tokens


class _ForgetsBlocks(_RollBack):
    """Bug: the blocks leave the table but never reach the free list."""

    def give_back(self, blocks, seq_id):
        for block in blocks:
            self._refcount[block] -= 1


class _FreesSharedBlocks(_RollBack):
    """Bug: every dropped block goes back to the free list, even one a sibling still holds."""

    def give_back(self, blocks, seq_id):
        for block in reversed(blocks):
            self._refcount[block] = 0
            self._free.push(block)


def _correct_step(m, drafts, verify):
    reservation = m.reserve_step({s: k + 1 for s, k in drafts.items()})
    try:
        accepted = verify(reservation)
    except BaseException:
        m.end_step(reservation, ran=False)
        raise
    m.end_step(reservation)
    kept, start = {}, 0
    for s, k in drafts.items():
        kept[s] = reservation.slot_mapping[start:start + accepted[s] + 1].tolist()
        start += k + 1
        m.roll_back_tokens(s, k - accepted[s])
    return kept


def _reserves_again(m, drafts, verify):
    """Bug: aborts the verified step and reserves only the kept tokens: the blocks may differ
    from those the forward wrote into (a stale slot mapping)."""
    reservation = m.reserve_step({s: k + 1 for s, k in drafts.items()})
    try:
        accepted = verify(reservation)
    finally:
        m.end_step(reservation, ran=False)
    again = m.reserve_step({s: accepted[s] + 1 for s in drafts})
    m.end_step(again)
    kept, start = {}, 0
    for s in drafts:
        kept[s] = again.slot_mapping[start:start + accepted[s] + 1].tolist()
        start += accepted[s] + 1
    return kept


def _keeps_only_accepted(m, drafts, verify):
    """Bug: drops the pending token along with the rejected drafts."""
    reservation = m.reserve_step({s: k + 1 for s, k in drafts.items()})
    accepted = verify(reservation)
    m.end_step(reservation)
    kept, start = {}, 0
    for s, k in drafts.items():
        kept[s] = reservation.slot_mapping[start:start + accepted[s]].tolist()
        start += k + 1
        m.roll_back_tokens(s, k + 1 - accepted[s])
    return kept


def _no_abort(m, drafts, verify):
    """Bug: a failing forward leaves the reservation pending."""
    reservation = m.reserve_step({s: k + 1 for s, k in drafts.items()})
    accepted = verify(reservation)
    m.end_step(reservation)
    kept, start = {}, 0
    for s, k in drafts.items():
        kept[s] = reservation.slot_mapping[start:start + accepted[s] + 1].tolist()
        start += k + 1
        m.roll_back_tokens(s, k - accepted[s])
    return kept


@pytest.mark.grader
def test_11_4_the_grader_accepts_a_correct_answer():
    grade_speculative(_RollBack, _correct_step)


@pytest.mark.parametrize("manager_cls,step", [
    (_KeepsBlocks, _correct_step), (_ForgetsBlocks, _correct_step),
    (_FreesSharedBlocks, _correct_step), (_RollBack, _reserves_again),
    (_RollBack, _keeps_only_accepted), (_RollBack, _no_abort),
], ids=["leaks blocks", "forgets blocks", "frees shared blocks", "stale slot mapping",
        "drops the pending token", "no abort"])
@pytest.mark.grader
def test_11_4_the_grader_rejects_planted_bugs(manager_cls, step):
    with pytest.raises(AssertionError):
        grade_speculative(manager_cls, step)
