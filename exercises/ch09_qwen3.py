"""Chapter 9 exercises: Qwen3 on the paged cache.

Replace each `raise NotImplementedError(...)` with your answer, then run `make check-exercises`.
"""

import torch


def new_token_slots(block_table: list[int], context_len: int, count: int, block_size: int) -> list[int]:
    """Exercise 9.1: cache slots of `count` new tokens placed after `context_len` cached ones."""
    raise NotImplementedError("Exercise 9.1: return the slot of each new token "
                              "(edit exercises/ch09_qwen3.py, new_token_slots)")


def prefix_causal_mask(context_len: int, query_len: int) -> torch.Tensor:
    """Exercise 9.2: bool [query_len, context_len + query_len], True where a new token may look."""
    raise NotImplementedError("Exercise 9.2: return the causal mask over a cached prefix and the new "
                              "tokens (edit exercises/ch09_qwen3.py, prefix_causal_mask)")


def last_token_rows(query_lens: list[int]) -> list[int]:
    """Exercise 9.3: flat row of the last new token of each sequence of a flat batch."""
    raise NotImplementedError("Exercise 9.3: return the row of each sequence's last new token "
                              "(edit exercises/ch09_qwen3.py, last_token_rows)")
