"""Checks for the chapter 3 exercises (exercises/ch03_block_tables.py)."""

from minipaged.block_table import last_block_waste, physical_address
from tests.exercises.answers import load

ex = load("ch03_block_tables")


def test_3_1_address():
    table = [5, 2, 9]
    assert [tuple(ex.address(table, t, 4)) for t in (0, 6, 11)] == [(5, 0), (2, 2), (9, 3)]
    assert [ex.address(table, t, 4)[0] * 4 + ex.address(table, t, 4)[1] for t in (0, 6, 11)] == [20, 10, 39]
    assert tuple(ex.address([7, 1], 6, 4)) == (1, 2)
    for t in range(12):
        assert tuple(ex.address(table, t, 4)) == tuple(physical_address(table, t, 4))


def test_3_2_last_block_waste():
    assert ex.last_block_waste(10, 4) == 2
    assert ex.last_block_waste(12, 4) == 0 and ex.last_block_waste(9, 4) == 3
    for length in range(0, 100):
        for block_size in (1, 3, 16):
            assert ex.last_block_waste(length, block_size) == last_block_waste(length, block_size)


def test_3_3_pool_is_consistent():
    assert ex.pool_is_consistent({"A": [0, 3], "B": [1]}, [2], 4)
    assert not ex.pool_is_consistent({"A": [0, 3], "B": [1]}, [2, 3], 4)   # block 3 used and free
    assert not ex.pool_is_consistent({"A": [0, 1], "B": [1]}, [2, 3], 4)   # block 1 in two tables
    assert not ex.pool_is_consistent({"A": [0, 3]}, [2], 4)                # block 1 lost
    assert not ex.pool_is_consistent({"A": [0, 3, 4], "B": [1]}, [2], 4)   # block 4 out of range
    assert not ex.pool_is_consistent({"A": [0, 0], "B": [1, 3]}, [2], 4)   # a block twice in a table
    assert ex.pool_is_consistent({}, [3, 1, 0, 2], 4) and ex.pool_is_consistent({}, [], 0)
