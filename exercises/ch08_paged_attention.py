"""Chapter 8 exercises: paged decode attention.

Replace each `raise NotImplementedError(...)` with your answer, then run `make check-exercises`.
"""

import torch


def merge_partials(o1: torch.Tensor, m1: float, l1: float, o2: torch.Tensor, m2: float,
                   l2: float) -> tuple[torch.Tensor, float, float]:
    """Exercise 8.1: merge two (normalised output, max score, denominator) triples of one query."""
    raise NotImplementedError("Exercise 8.1: rescale both partials to the common max and combine "
                              "(edit exercises/ch08_paged_attention.py, merge_partials)")


def decode_kv_bytes(batch: int, seq_len: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Exercise 8.2: bytes of K and V one decode step of one layer must read."""
    raise NotImplementedError("Exercise 8.2: count the K and V bytes of every cached token "
                              "(edit exercises/ch08_paged_attention.py, decode_kv_bytes)")


def time_floor_us(bytes_: int, bandwidth_tb_s: float) -> float:
    """Exercise 8.2: the shortest possible time, in microseconds, to read bytes_ at that bandwidth."""
    raise NotImplementedError("Exercise 8.2: bytes over bandwidth, in microseconds "
                              "(edit exercises/ch08_paged_attention.py, time_floor_us)")


def split_plan(batch: int, num_kv_heads: int, max_tokens: int, num_sms: int,
               min_tokens_per_split: int = 256, programs_per_sm: int = 2) -> int:
    """Exercise 8.3: the number of KV splits by the rule of minipaged's choose_num_splits."""
    raise NotImplementedError("Exercise 8.3: fill the SMs, but keep every split long enough "
                              "(edit exercises/ch08_paged_attention.py, split_plan)")
