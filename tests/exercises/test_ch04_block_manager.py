"""Checks for the chapter 4 exercises (exercises/ch04_block_manager.py)."""

from tests.exercises.answers import load

ex = load("ch04_block_manager")


def test_4_1_conserved():
    assert ex.conserved(6, [0, 5], {"A": [3, 1], "B": [2, 4]})
    assert ex.conserved(2, [], {"A": [1, 0]})
    assert ex.conserved(0, [], {})
    assert not ex.conserved(6, [0, 5, 1], {"A": [3, 1], "B": [2, 4]})   # free and allocated
    assert not ex.conserved(6, [0, 5], {"A": [3, 1], "B": [2, 1]})      # in two tables (4 lost)
    assert not ex.conserved(6, [0], {"A": [3, 1], "B": [2, 4]})         # block 5 lost
    assert not ex.conserved(6, [0, 5], {"A": [3, 1], "B": [2, 4, 6]})   # outside the pool
    assert not ex.conserved(4, [0, 0], {"A": [1, 2]})                    # twice in the free list


def test_4_2_blocks_for_step():
    assert ex.blocks_for_step([4, 6, 8, 3], [1, 1, 1, 1], 4) == 2
    assert ex.blocks_for_step([0], [1], 16) == 1
    assert ex.blocks_for_step([0], [0], 16) == 0
    assert ex.blocks_for_step([5, 0], [11, 33], 4) == 2 + 9
    assert ex.blocks_for_step([], [], 4) == 0


def test_4_3_decode_slot_mapping():
    assert ex.decode_slot_mapping([[5, 2, 9]] * 3, [0, 6, 11], 4) == [20, 10, 39]
    assert ex.decode_slot_mapping([[7, 1], [7, 1, 3]], [7, 8], 4) == [7, 12]
    assert ex.decode_slot_mapping([], [], 16) == []
