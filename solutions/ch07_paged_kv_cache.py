"""Chapter 7 reference solutions."""

import torch
import triton
import triton.language as tl


def element_offset(slot: int, head: int, dim: int, block_size: int, num_kv_heads: int,
                   head_dim: int, layout: str, dtype_bytes: int = 2) -> int:
    block, offset = divmod(slot, block_size)
    if layout == "NHD":
        return ((block * block_size + offset) * num_kv_heads + head) * head_dim + dim
    if layout == "HND":
        return ((block * num_kv_heads + head) * block_size + offset) * head_dim + dim
    if layout == "V0":
        x = 16 // dtype_bytes
        return ((((block * num_kv_heads + head) * (head_dim // x) + dim // x) * block_size
                 + offset) * x + dim % x)
    raise ValueError(f"unknown layout {layout!r}")


@triton.jit
def _write_v0_kernel(key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, num_slots,
                     stride_kn, stride_kh, stride_vn, stride_vh,
                     BLOCK_SIZE: tl.constexpr, NUM_HEADS: tl.constexpr,
                     HEAD_DIM: tl.constexpr, X: tl.constexpr, HEADS_PAD: tl.constexpr,
                     DIM_PAD: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    heads = tl.arange(0, HEADS_PAD)[:, None]
    dims = tl.arange(0, DIM_PAD)[None, :]
    slots = tl.full((HEADS_PAD, DIM_PAD), 0, tl.int64) + slot
    mask = (heads < NUM_HEADS) & (dims < HEAD_DIM) & (slots >= 0) & (slots < num_slots)
    k = tl.load(key_ptr + token * stride_kn + heads * stride_kh + dims, mask=mask)
    v = tl.load(value_ptr + token * stride_vn + heads * stride_vh + dims, mask=mask)
    bh = block * NUM_HEADS + heads
    k_dst = ((bh * (HEAD_DIM // X) + dims // X) * BLOCK_SIZE + offset) * X + dims % X
    v_dst = (bh * HEAD_DIM + dims) * BLOCK_SIZE + offset
    tl.store(k_cache_ptr + k_dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv_v0(key_cache: torch.Tensor, value_cache: torch.Tensor, key: torch.Tensor,
                value: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    num_blocks, num_heads, _, block_size, x = key_cache.shape
    head_dim = value_cache.shape[2]
    key, value = key.contiguous(), value.contiguous()
    _write_v0_kernel[(slot_mapping.shape[0],)](
        key, value, key_cache, value_cache, slot_mapping, num_blocks * block_size,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        BLOCK_SIZE=block_size, NUM_HEADS=num_heads, HEAD_DIM=head_dim, X=x,
        HEADS_PAD=triton.next_power_of_2(num_heads), DIM_PAD=triton.next_power_of_2(head_dim))
