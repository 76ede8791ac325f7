"""Chapter 8 reference solutions."""

import math

import torch


def merge_partials(o1: torch.Tensor, m1: float, l1: float, o2: torch.Tensor, m2: float,
                   l2: float) -> tuple[torch.Tensor, float, float]:
    m = max(m1, m2)
    w1 = math.exp(m1 - m) * l1 if l1 > 0 else 0.0
    w2 = math.exp(m2 - m) * l2 if l2 > 0 else 0.0
    l = w1 + w2
    return (w1 * o1 + w2 * o2) / l, m, l


def decode_kv_bytes(batch: int, seq_len: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    return 2 * batch * seq_len * num_kv_heads * head_dim * dtype_bytes


def time_floor_us(bytes_: int, bandwidth_tb_s: float) -> float:
    return bytes_ / (bandwidth_tb_s * 1e12) * 1e6


def split_plan(batch: int, num_kv_heads: int, max_tokens: int, num_sms: int,
               min_tokens_per_split: int = 256, programs_per_sm: int = 2) -> int:
    wanted = programs_per_sm * num_sms // max(1, batch * num_kv_heads)
    return max(1, min(wanted, max_tokens // min_tokens_per_split, 64))
