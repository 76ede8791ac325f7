"""Chapter 9 reference solutions."""

import torch


def new_token_slots(block_table: list[int], context_len: int, count: int, block_size: int) -> list[int]:
    positions = range(context_len, context_len + count)
    return [block_table[p // block_size] * block_size + p % block_size for p in positions]


def prefix_causal_mask(context_len: int, query_len: int) -> torch.Tensor:
    keys = torch.arange(context_len + query_len)
    return keys[None, :] <= context_len + torch.arange(query_len)[:, None]


def last_token_rows(query_lens: list[int]) -> list[int]:
    rows, total = [], 0
    for n in query_lens:
        total += n
        rows.append(total - 1)
    return rows
