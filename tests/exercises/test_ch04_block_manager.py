"""Checks for the chapter 4 exercises (exercises/ch04_block_manager.py)."""

import pytest

from minipaged.memory.block_manager import NoFreeBlocksError, TeachingBlockManager
from tests.exercises.answers import load

ex = load("ch04_block_manager")


def boundary_rule(lengths, new_tokens, block_size):
    """The decode rule: one new block for each sequence whose length is a multiple of B."""
    return sum(1 for length in lengths if length % block_size == 0)


def blocks_needed(lengths, new_tokens, block_size):
    """New blocks a step needs, counted position by position: the blocks its new tokens touch
    that the sequence does not hold yet."""
    total = 0
    for length, n in zip(lengths, new_tokens):
        held = set(range(-(-length // block_size)))
        total += len({pos // block_size for pos in range(length, length + n)} - held)
    return total


def misleads(kind, step):
    lengths, new_tokens, block_size = step
    assert block_size >= 1 and len(lengths) == len(new_tokens) >= 1, f"{kind}: not a step: {step}"
    assert all(n >= 0 for n in lengths) and all(n >= 0 for n in new_tokens), \
        f"{kind}: lengths and new tokens are counts: {step}"
    rule, need = boundary_rule(*step), blocks_needed(*step)
    if kind == "under":
        assert rule < need, f"on {step} the rule reserves {rule} and the step needs {need}"
    else:
        assert rule > need, f"on {step} the rule reserves {rule} and the step needs {need}"


@pytest.mark.parametrize("kind", ["under", "over"])
def test_4_1_boundary_rule_counterexamples(kind):
    steps = ex.boundary_rule_counterexamples()
    assert kind in steps, "return a step for 'under' and one for 'over'"
    misleads(kind, steps[kind])


@pytest.mark.grader
@pytest.mark.parametrize("kind,step", [
    ("under", ([4, 6, 8, 3], [1, 1, 1, 1], 4)),   # one token each: the rule is exact
    ("over", ([4, 6, 8, 3], [1, 1, 1, 1], 4)),
    ("under", ([4], [4], 4)),                      # one boundary crossed: the rule is right
    ("over", ([4], [0], 0)),                       # not a step: block size 0
])
def test_4_1_the_check_rejects_steps_where_the_rule_holds(kind, step):
    with pytest.raises(AssertionError):
        misleads(kind, step)


# Exercise 4.2 is graded by injected failures: the free list's k-th pop raises, for every k the
# step reaches, and the manager must be exactly as before. Planted wrong answers below show that
# the grading catches each of them.

class InjectedFailure(Exception):
    pass


class FlakyFreeList(list):
    """A free list whose ``fail_at``-th pop raises InjectedFailure (None: never)."""

    def __init__(self, blocks, fail_at=None):
        super().__init__(blocks)
        self.fail_at, self.pops = fail_at, 0

    def pop(self, *args):
        self.pops += 1
        if self.pops == self.fail_at:
            raise InjectedFailure(f"pop {self.pops} of the free list failed")
        return super().pop(*args)


STEP = ["A", "B", "C", "A", "D"]   # 4 allocations: B, C, A (at position 4) and D need a block


def scenario(cls):
    """8 blocks of 2 slots: A holds 3 tokens, B 4; 4 blocks are free."""
    m = cls(8, 2)
    for r in "AAABBBB":
        m.append(r)
    return m


def state(m):
    return list(m.free_list), {r: list(t) for r, t in m.tables.items()}, dict(m.lengths)


def grade_atomic_step(cls):
    ref = scenario(TeachingBlockManager)
    expected = [ref.append(r) for r in STEP]
    m = scenario(cls)
    assert m.step(STEP) == expected, "a step that succeeds must give the slots of plain appends"
    assert state(m) == state(ref), "a step that succeeds must leave what plain appends leave"

    m = scenario(cls)
    before = state(m)
    assert m.step([]) == [] and state(m) == before, "an empty step changes nothing"
    try:
        m.step(STEP + ["E"])                               # E needs a fifth block
    except NoFreeBlocksError:
        pass
    else:
        raise AssertionError("a step without enough free blocks must raise NoFreeBlocksError")
    assert state(m) == before, "a step that ran out of blocks changed the manager"

    for k in range(1, 5):
        m = scenario(cls)
        m.free_list = FlakyFreeList(m.free_list, fail_at=k)
        before = state(m)
        try:
            m.step(STEP)
        except InjectedFailure:
            pass
        else:
            raise AssertionError(f"the failure injected at allocation {k} did not reach the caller")
        assert state(m) == before, f"a failure at allocation {k} of the step changed the manager"
        m.free_list.fail_at = None
        assert m.step(STEP) == expected, "after a failed step the manager must still work"


def test_4_2_atomic_step():
    grade_atomic_step(ex.AtomicTeachingManager)


class NoRollback(TeachingBlockManager):
    def step(self, requests):
        return [self.append(r) for r in requests]


class ChecksFreeBlocksOnly(TeachingBlockManager):
    """Counts the blocks first (so running out changes nothing), but cannot undo a failure."""

    def step(self, requests):
        lengths, needed = dict(self.lengths), 0
        for r in requests:
            n = lengths.get(r, 0)
            needed += n % self.block_size == 0
            lengths[r] = n + 1
        if needed > len(self.free_list):
            raise NoFreeBlocksError(needed, len(self.free_list), "the step")
        return [self.append(r) for r in requests]


class Snapshot(TeachingBlockManager):
    """A correct answer: restore a snapshot and re-raise. Its subclasses get one detail wrong."""

    def step(self, requests):
        free, tables, lengths = list(self.free_list), dict(self.tables), dict(self.lengths)
        try:
            return [self.append(r) for r in requests]
        except BaseException as error:
            if self.should_restore(error):
                self.restore(free, tables, lengths)
                return self.after_restore(error)
            raise

    def should_restore(self, error):
        return True

    def restore(self, free, tables, lengths):
        self.free_list[:] = free
        self.tables.clear(), self.tables.update(tables)
        self.lengths.clear(), self.lengths.update(lengths)

    def after_restore(self, error):
        raise error


class RestoresBlocksInWrongOrder(Snapshot):
    """Puts the taken blocks back in the order they were taken (pop() takes from the end)."""

    def restore(self, free, tables, lengths):
        taken = free[len(self.free_list):]
        super().restore(free, tables, lengths)
        self.free_list[len(free) - len(taken):] = taken[::-1]


class ForgetsNewRequests(Snapshot):
    """Restores the requests that existed, but keeps the ones the step started."""

    def restore(self, free, tables, lengths):
        started = {r: (self.tables[r], self.lengths[r]) for r in self.tables if r not in tables}
        super().restore(free, tables, lengths)
        for r, (table, length) in started.items():
            self.tables[r], self.lengths[r] = table, length


class SwallowsTheError(Snapshot):
    def after_restore(self, error):
        return []


class RollsBackOnlyWhenOutOfBlocks(Snapshot):
    def should_restore(self, error):
        return isinstance(error, NoFreeBlocksError)


@pytest.mark.grader
def test_4_2_a_correct_snapshot_passes_the_grading():
    grade_atomic_step(Snapshot)


@pytest.mark.parametrize("buggy", [NoRollback, ChecksFreeBlocksOnly, RestoresBlocksInWrongOrder,
                                   ForgetsNewRequests, SwallowsTheError,
                                   RollsBackOnlyWhenOutOfBlocks])
@pytest.mark.grader
def test_4_2_grading_catches_planted_bugs(buggy):
    with pytest.raises(AssertionError, match="changed the manager|did not reach|must raise"):
        grade_atomic_step(buggy)
