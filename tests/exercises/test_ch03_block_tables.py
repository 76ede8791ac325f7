"""Checks for the chapter 3 exercises (exercises/ch03_block_tables.py)."""

import random

import pytest

from minipaged.book.fragmentation import generate_workload
from tests.exercises.answers import load

ex = load("ch03_block_tables")


# Exercise 3.1: the wrong address functions, and the check that an input exposes one.
WRONG_ADDRESS = {
    "logical": lambda table, t, B: (t // B, t % B),                       # no table lookup
    "swapped": lambda table, t, B: (table[t % B], t // B),                # divide and modulo swapped
    "offset_by_table": lambda table, t, B: (table[t // B], t % len(table)),  # modulo the table
}


def exposes(name, example):
    """An AssertionError unless ``example`` is a valid input on which bug ``name`` is wrong."""
    table, position, block_size = example
    assert len(set(table)) == len(table) and all(b >= 0 for b in table), \
        f"{name}: the block table must hold distinct block ids, got {table}"
    assert block_size >= 1 and 0 <= position < len(table) * block_size, \
        f"{name}: position {position} is not covered by {len(table)} blocks of {block_size}"
    right = (table[position // block_size], position % block_size)
    try:
        wrong = tuple(WRONG_ADDRESS[name](table, position, block_size))
    except IndexError:
        return                                   # the bug crashes on it: exposed too
    assert wrong != right, f"{name} gives the right answer {right} on {example}: pick another"


@pytest.mark.parametrize("name", sorted(WRONG_ADDRESS))
def test_3_1_counterexamples(name):
    examples = ex.counterexamples()
    assert name in examples, f"give an input for each of {sorted(WRONG_ADDRESS)}"
    exposes(name, examples[name])


@pytest.mark.grader
@pytest.mark.parametrize("name,example", [
    ("logical", ([0, 1, 2], 6, 4)),        # the identity table hides a missing lookup
    ("swapped", ([5, 2, 9], 0, 4)),        # position 0: t // B == t % B == 0
    ("offset_by_table", ([5, 2, 9], 6, 3)),  # B equal to the table's length
    ("logical", ([5, 2, 9], 12, 4)),       # not covered by the table
    ("swapped", ([5, 5, 9], 6, 4)),        # not distinct block ids
])
def test_3_1_the_check_rejects_inputs_that_expose_nothing(name, example):
    with pytest.raises(AssertionError):
        exposes(name, example)


def test_3_2_predict_mean_waste():
    predicted = ex.predict_mean_waste()
    for block_size in (1, 16, 256):
        wastes = [(block_size - n % block_size) % block_size for n in range(1, 4097)]
        mean = sum(wastes) / len(wastes)
        assert block_size in predicted, f"predict the mean waste for block size {block_size}"
        assert predicted[block_size] == pytest.approx(mean), \
            f"block size {block_size}: you predicted {predicted[block_size]}, the mean is {mean}"


def test_3_3_pool_is_consistent():
    assert ex.pool_is_consistent({"A": [0, 3], "B": [1]}, [2], 4)
    assert not ex.pool_is_consistent({"A": [0, 3], "B": [1]}, [2, 3], 4)   # block 3 used and free
    assert not ex.pool_is_consistent({"A": [0, 1], "B": [1]}, [2, 3], 4)   # block 1 in two tables
    assert not ex.pool_is_consistent({"A": [0, 3]}, [2], 4)                # block 1 lost
    assert not ex.pool_is_consistent({"A": [0, 3, 4], "B": [1]}, [2], 4)   # block 4 out of range
    assert not ex.pool_is_consistent({"A": [0, 0], "B": [1, 3]}, [2], 4)   # a block twice in a table
    assert ex.pool_is_consistent({}, [3, 1, 0, 2], 4) and ex.pool_is_consistent({}, [], 0)


# -- 3.4: any block size a correct analysis allows passes; planted wrong answers fail ------------

CANDIDATES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def grade_block_size(lengths, answer, max_waste, max_table):
    """None if ``answer`` is a defensible choice, else the reason it is not."""
    block_size, numbers = answer
    rows = {b: {"block_size": b, **_numbers(lengths, b)} for b in CANDIDATES}
    if block_size not in rows:
        return f"{block_size} is not a power of two from 1 to 256"
    row = rows[block_size]
    if row["waste_share"] > max_waste:
        return f"block size {block_size} wastes {row['waste_share']:.1%} > {max_waste:.0%}"
    if row["mean_table_len"] > max_table:
        return f"block size {block_size}: mean table {row['mean_table_len']:.1f} > {max_table}"
    for key in ("waste_share", "mean_table_len"):
        if numbers.get(key) != pytest.approx(row[key], rel=1e-6):
            return f"the {key} you report ({numbers.get(key)}) is not {row[key]}"
    return None


def _lengths(name, seed=0):
    return [r.total_len for r in generate_workload(name, 2000, seed=seed)]


def _numbers(lengths, block_size):
    """Waste share and mean table length, counted here (not with the chapter's sweep)."""
    entries = [-(-n // block_size) for n in lengths]
    allocated = block_size * sum(entries)
    return {"waste_share": (allocated - sum(lengths)) / allocated,
            "mean_table_len": sum(entries) / len(entries)}


def test_3_4_choose_block_size():
    cases = [(_lengths("sharegpt"), 0.05, 64), (_lengths("alpaca"), 0.05, 64),
             (_lengths("sharegpt", seed=3), 0.01, 64), (_lengths("alpaca", seed=4), 0.02, 30),
             ([1000] * 10, 0.05, 64), ([3, 5, 7, 9] * 50, 0.5, 8)]
    for lengths, max_waste, max_table in cases:
        answer = ex.choose_block_size(lengths, max_waste, max_table)
        problem = grade_block_size(lengths, answer, max_waste, max_table)
        assert problem is None, problem
    # the grader refuses the planted wrong answers
    alpaca = _lengths("alpaca")
    floor_numbers = {"waste_share": 0.0, "mean_table_len": sum(n // 4 for n in alpaca) / 2000}
    for wrong in ((256, _numbers(alpaca, 256)),        # wastes most of every block
                  (16, _numbers(alpaca, 16)),          # a habit, not an analysis: ~9% waste
                  (1, _numbers(alpaca, 1)),            # tables far too long
                  (4, floor_numbers),                  # floor instead of ceiling
                  (12, _numbers(alpaca, 4))):          # not a power of two
        assert grade_block_size(alpaca, wrong, 0.05, 64) is not None, wrong


# -- 3.5: a correct manager and planted off-by-one bugs, for the learner's sentinel check ------

class Manager:
    """A correct little block manager: a shuffled free list, one table per sequence."""

    def __init__(self, num_blocks, block_size):
        self.block_size = block_size
        self.free = list(range(num_blocks))
        random.Random(0).shuffle(self.free)
        self.tables, self.lengths = {}, {}

    def _new_block(self, seq):
        return self.free.pop()

    def _needs_block(self, n):
        return n % self.block_size == 0

    def append(self, seq):
        table = self.tables.setdefault(seq, [])
        n = self.lengths.get(seq, 0)
        if self._needs_block(n):
            table.append(self._new_block(seq))
        self.lengths[seq] = n + 1
        return table[-1] * self.block_size + n % self.block_size

    def slot(self, seq, position):
        block = self.tables[seq][position // self.block_size]
        return block * self.block_size + position % self.block_size


class AllocatesLate(Manager):
    """Bug: a new block is taken one token after the boundary."""

    def _needs_block(self, n):
        return n == 0 or (n % self.block_size == 1 and n > 1)


class OffsetAfterIncrement(Manager):
    """Bug: the offset is computed from the length after it moved."""

    def append(self, seq):
        slot = super().append(seq)
        n = self.lengths[seq]
        return slot - (n - 1) % self.block_size + n % self.block_size


class ReadsPreviousBlock(Manager):
    """Bug: the read path takes the previous block for the first token of each block."""

    def slot(self, seq, position):
        logical = max(position - 1, 0) // self.block_size
        block = self.tables[seq][logical]
        return block * self.block_size + position % self.block_size


class LogicalAsPhysical(Manager):
    """Bug: every sequence uses blocks 0, 1, 2, ... (its logical numbers) as physical ones."""

    def _new_block(self, seq):
        return len(self.tables[seq])


class TableCappedAtThree(Manager):
    """Bug: the read path never looks past the third table entry."""

    def slot(self, seq, position):
        block = self.tables[seq][min(position // self.block_size, 2)]
        return block * self.block_size + position % self.block_size


@pytest.mark.parametrize("buggy", [AllocatesLate, OffsetAfterIncrement, ReadsPreviousBlock,
                                   LogicalAsPhysical, TableCappedAtThree])
def test_3_5_sentinel_check(buggy):
    ex.sentinel_check(Manager)                         # a correct manager passes
    with pytest.raises(AssertionError):
        ex.sentinel_check(buggy)
