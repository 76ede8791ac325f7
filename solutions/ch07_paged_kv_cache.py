"""Chapter 7 reference solutions."""

import torch


def slot_of(block_table: list[int], block_size: int, position: int) -> int:
    return block_table[position // block_size] * block_size + position % block_size


def last_block_waste(num_tokens: int, block_size: int) -> int:
    return (-num_tokens) % block_size


def element_offset(slot: int, head: int, dim: int, block_size: int, num_kv_heads: int,
                   head_dim: int, layout: str) -> int:
    block, offset = divmod(slot, block_size)
    if layout == "NHD":
        return ((block * block_size + offset) * num_kv_heads + head) * head_dim + dim
    if layout == "HND":
        return ((block * num_kv_heads + head) * block_size + offset) * head_dim + dim
    raise ValueError(f"unknown layout {layout!r}")


def swap_out_reference(gpu_storage: torch.Tensor, cpu_storage: torch.Tensor,
                       pairs: list[tuple[int, int]]) -> None:
    for src, dst in pairs:
        cpu_storage[:, :, dst] = gpu_storage[:, :, src].to(cpu_storage.device)
