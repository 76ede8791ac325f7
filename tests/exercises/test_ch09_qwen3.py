"""Checks for the chapter 9 exercises (exercises/ch09_qwen3.py)."""

import torch

from tests.exercises.answers import load

ex = load("ch09_qwen3")


def test_9_1_new_token_slots():
    assert ex.new_token_slots([5, 2, 9], 6, 3, 4) == [10, 11, 36]      # the chapter's question
    assert ex.new_token_slots([7, 1], 0, 3, 2) == [14, 15, 2]
    assert ex.new_token_slots([4, 0, 6], 4, 1, 2) == [12]
    assert ex.new_token_slots([3], 0, 0, 16) == []


def test_9_2_prefix_causal_mask():
    mask = ex.prefix_causal_mask(2, 3)
    assert mask.dtype == torch.bool and mask.shape == (3, 5)
    assert mask.tolist() == [[True, True, True, False, False],
                             [True, True, True, True, False],
                             [True, True, True, True, True]]
    assert torch.equal(ex.prefix_causal_mask(0, 4), torch.ones(4, 4, dtype=torch.bool).tril())
    assert ex.prefix_causal_mask(6, 1).all()        # one decode token sees everything


def test_9_3_last_token_rows():
    assert ex.last_token_rows([3, 1, 3]) == [2, 3, 6]
    assert ex.last_token_rows([1, 1, 1, 1]) == [0, 1, 2, 3]
    assert ex.last_token_rows([500] * 8)[-1] == 3999
