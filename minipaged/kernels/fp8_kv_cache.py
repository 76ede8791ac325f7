# GENERATED from chapters/13_fp8_kv_cache.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/13_fp8_kv_cache.md § The idea: eight bits and a scale
"""An FP8 paged KV cache: e4m3 blocks with one scale per (slot, KV head)."""

from __future__ import annotations

import copy
from typing import Iterable, NamedTuple

import torch

from minipaged.runtime import tl, triton  # Triton, or its stand-in (chapter 0)

from minipaged.kernels.decode_attention import (PagedAttentionError, check_decode_inputs,
                                                decode_launch_config, launch_decode,
                                                range_of_split, split_plan)
from minipaged.kernels.kv_cache import (KVCacheError, PagedKVCache, copy_blocks_between,
                                        copy_blocks_kernel, block_pairs)
from minipaged.memory.sizing import block_bytes

__all__ = [
    "FP8_DTYPE", "FP8_MAX", "Fp8PagedKVCache", "fp8_supported",
    "quantize_reference", "dequantize_reference", "fp8_bytes_per_token", "new_fp8_cache",
    "fp8_block_bytes",
]

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
"""Largest finite e4m3 value, 1.75 * 2**8."""


def fp8_supported(device: torch.device | str) -> bool:
    """Whether e4m3 runs on ``device``: CUDA compute capability 8.9+, or the CPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return True
    return torch.cuda.get_device_capability(device) >= (8, 9)


# %% chapters/13_fp8_kv_cache.md § Version 2: the FP8 paged cache
def quantize_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., D]`` as e4m3 with one fp32 scale per row (``amax / 448``), in torch."""
    x = x.float()
    amax = x.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (x / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale.squeeze(-1)


def dequantize_reference(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The fp32 values ``q * scale`` (``scale`` has one entry per row of ``q``)."""
    return q.float() * scale.float()[..., None]


def fp8_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int,
                        scale_bytes: int = 4) -> int:
    """Bytes of K and V of one token in the FP8 cache, all layers: 1 byte an element
    plus one ``scale_bytes`` scale per (layer, K or V, KV head) row."""
    return 2 * num_layers * num_kv_heads * (head_dim + scale_bytes)


# %% chapters/13_fp8_kv_cache.md § Version 2: the FP8 paged cache
class Fp8PagedKVCache(PagedKVCache):
    """A ``PagedKVCache`` whose blocks hold e4m3 values, each (slot, KV head) row of K
    and V with its own fp32 scale in ``scales[layer, 0|1, block, head, token]``.

    ``write`` quantizes, ``gather`` and ``paged_attention`` dequantize; ``copy_blocks``,
    ``swap_out``/``swap_in`` and ``cpu_pool`` carry the scales with their blocks.
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int,
                 num_kv_heads: int, head_dim: int,
                 device: torch.device | str | None = None,
                 pin_memory: bool = False) -> None:
        super().__init__(num_layers, num_blocks, block_size, num_kv_heads, head_dim,
                         FP8_DTYPE, device, "NHD", pin_memory)
        self.scales = torch.ones((num_layers, 2, num_blocks, num_kv_heads, block_size),
                                 dtype=torch.float32, device=self.device,
                                 pin_memory=pin_memory)

    @property
    def nbytes(self) -> int:
        scales = self.scales.numel() * self.scales.element_size()
        return self.storage.numel() * self.storage.element_size() + scales

    def scale_strides(self) -> tuple[int, int]:
        """Element strides (block, head) of one layer's K (and V) scales."""
        return self.scales.stride(2), self.scales.stride(3)

    def __repr__(self) -> str:
        return "Fp8" + super().__repr__()

    # %% chapters/13_fp8_kv_cache.md § Writing: scale, saturate, round
    def _checked_write(self, layer: int, key: torch.Tensor, value: torch.Tensor,
                       slot_mapping: torch.Tensor, check_slots: bool | None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """``PagedKVCache.write``'s checks; returns key and value with unit last stride."""
        self._layer(layer)
        if slot_mapping.dim() != 1 or slot_mapping.dtype not in (torch.int32, torch.int64):
            raise KVCacheError(f"slot_mapping must be a 1-D int32/int64 tensor, got "
                               + f"{slot_mapping.dtype} of shape "
                               + f"{list(slot_mapping.shape)}")
        n = slot_mapping.shape[0]
        key, value = self._checked_kv("key", key, n), self._checked_kv("value", value, n)
        if check_slots is None:
            check_slots = slot_mapping.device.type == "cpu"
        if check_slots and n:
            low, high = int(slot_mapping.min()), int(slot_mapping.max())
            if low < -1 or high >= self.num_slots:
                raise KVCacheError(f"slot_mapping holds slots in [{low}, {high}] but this "
                                   + f"cache has slots 0..{self.num_slots - 1} "
                                   + "(and -1 for 'skip')")
        return key, value

    def write(self, layer: int, key: torch.Tensor, value: torch.Tensor,
              slot_mapping: torch.Tensor, check_slots: bool | None = None) -> None:
        """Quantize ``key[i]``, ``value[i]`` (``[N, H_kv, D]``) into ``slot_mapping[i]``:
        per (token, head) scale ``amax / 448``, saturate, round to nearest even.
        Slot -1 skips; checks as ``PagedKVCache.write``."""
        key, value = self._checked_write(layer, key, value, slot_mapping, check_slots)
        num_tokens = slot_mapping.shape[0]
        if num_tokens == 0:
            return
        stride_block, stride_token, stride_head = self.strides()
        _write_fp8_kernel[(num_tokens,)](
            key, value, self.key_cache(layer), self.value_cache(layer),
            self.scales[layer, 0], self.scales[layer, 1], slot_mapping.to(self.device),
            self.num_slots, key.stride(0), key.stride(1), value.stride(0), value.stride(1),
            stride_block, stride_token, stride_head, *self.scale_strides(),
            BLOCK_SIZE=self.block_size, NUM_HEADS=self.num_kv_heads,
            HEAD_DIM=self.head_dim, HEADS_PAD=triton.next_power_of_2(self.num_kv_heads),
            DIM_PAD=triton.next_power_of_2(self.head_dim), FP8_MAX=FP8_MAX)

    # %% chapters/13_fp8_kv_cache.md § Reading back, and moving blocks
    def gather(self, layer: int, block_table, num_tokens: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of one sequence dequantized to fp32, ``[num_tokens, H_kv, D]`` each.

        Checks as ``PagedKVCache.gather``; indexes the values as bytes (torch's indexing
        kernels do not all take fp8).
        """
        table = torch.as_tensor(block_table, dtype=torch.long).to(self.device)
        if table.dim() != 1 or not 0 <= num_tokens <= table.numel() * self.block_size:
            raise KVCacheError(f"a 1-D block_table of {table.numel()} blocks of "
                               + f"{self.block_size} cannot hold {num_tokens} tokens")
        positions = torch.arange(num_tokens, device=self.device)
        blocks = table[positions // self.block_size]
        offsets = positions % self.block_size
        values = self.storage[self._layer(layer)].view(torch.uint8)       # [2, blocks, ...]
        key, value = (values[i][blocks, offsets].view(FP8_DTYPE) for i in (0, 1))
        scales = self.scales[layer].permute(1, 3, 0, 2)[blocks, offsets]   # [N, 2, H_kv]
        return (dequantize_reference(key, scales[:, 0]),
                dequantize_reference(value, scales[:, 1]))

    def copy_blocks(self, pairs: Iterable[tuple[int, int]] | torch.Tensor) -> None:
        """Copy-on-write of blocks and their scales (``PagedKVCache.copy_blocks``)."""
        pairs = block_pairs(self, pairs)
        PagedKVCache.copy_blocks(self, pairs)             # validates, copies the values
        if not pairs:
            return
        block_numel = self.num_kv_heads * self.block_size
        table = torch.tensor(pairs, dtype=torch.int64, device=self.device)
        copy_blocks_kernel[(len(pairs), 2 * self.num_layers, 1)](
            self.scales, table, self.num_blocks * block_numel, block_numel,
            CHUNK=triton.next_power_of_2(block_numel))

    def cpu_pool(self, num_blocks: int) -> "Fp8PagedKVCache":
        """A host-memory pool of ``num_blocks`` blocks and their scales (pinned)."""
        return Fp8PagedKVCache(self.num_layers, num_blocks, self.block_size,
                               self.num_kv_heads, self.head_dim, "cpu",
                               pin_memory=self.storage.device.type == "cuda")

    def swap_out(self, cpu_cache: "Fp8PagedKVCache", pairs) -> None:
        """Blocks ``(gpu_block, cpu_block)`` and their scales into ``cpu_cache``."""
        _swap(self, cpu_cache, pairs)

    def swap_in(self, cpu_cache: "Fp8PagedKVCache", pairs) -> None:
        """Blocks ``(cpu_block, gpu_block)`` of ``cpu_cache`` and their scales back."""
        _swap(cpu_cache, self, pairs)

    # %% chapters/13_fp8_kv_cache.md § Values in pairs of bytes
    def paged_attention(self, query: torch.Tensor, layer: int, block_tables: torch.Tensor,
                        seq_lens: torch.Tensor, scale: float | None = None,
                        num_splits: int | None = None, check_tables: bool | None = None,
                        out: torch.Tensor | None = None) -> torch.Tensor:
        """Chapter 8's ``paged_attention`` over this cache: e4m3 K/V dequantized on load,
        scores and sums in fp32. ``query`` is fp32, fp16 or bf16, and so is the result."""
        if query.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise PagedAttentionError(f"query must be fp32/fp16/bf16, got {query.dtype}")
        if self.head_dim % 2:
            raise PagedAttentionError(f"the kernel reads values in pairs of bytes: "
                                      + f"head_dim must be even, got {self.head_dim}")
        check_decode_inputs(query, self, layer, block_tables, seq_lens, match_dtype=False)
        device = query.device
        configs = tuple(_fp8_launch_config(self.head_dim, device, split, query.dtype)
                        for split in (False, True))
        plan = split_plan(query, self, block_tables, num_splits, configs=configs,
                          programs_per_sm=configs[0].programs_per_sm, block_aligned=False)
        launch, interpreted = plan.config, device.type != "cuda"
        return launch_decode(  # the interpreter's fp16 and bf16 arithmetic is unsafe: fp32
            _fp8_decode_kernel, query, self, block_tables, seq_lens, plan, scale=scale,
            out=out, check_tables=check_tables,
            compute_dtype=torch.float32 if interpreted else None,
            k_ptr=self.key_cache(layer), v_pairs_ptr=self.value_cache(layer).view(torch.int16),
            ks_ptr=self.scales[layer, 0], vs_ptr=self.scales[layer, 1],
            stride_sblock=self.scale_strides()[0], stride_shead=self.scale_strides()[1],
            DOT_DTYPE=launch.dot_dtype, INTERPRETED=interpreted,
            **({"maxnreg": launch.max_registers} if launch.max_registers else {}))


# %% chapters/13_fp8_kv_cache.md § Writing: scale, saturate, round
@triton.jit
def _round_to_e4m3(x):
    """``x`` (fp32, ``|x| <= 448``) rounded to the nearest e4m3 value, ties to even.

    From 2**-6 up, integer arithmetic on the fp32 bits keeps 3 of the 23 mantissa bits
    (a carry may step the exponent). Below, in e4m3's subnormals, the result is a whole
    multiple of 2**-9: ``x * 2**9`` rounded to an integer, every step exact.
    """
    a = tl.abs(x)
    bits = a.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000
    normal = bits.to(tl.float32, bitcast=True)
    y = a * 512.0                                   # exact: a power-of-two scaling
    low = y.to(tl.int32)                            # floor, since y >= 0
    rest = y - low.to(tl.float32)
    up = (rest > 0.5) | ((rest == 0.5) & ((low & 1) == 1))
    subnormal = (low + up.to(tl.int32)).to(tl.float32) * 0.001953125
    r = tl.where(a < 0.015625, subnormal, normal)
    sign = x.to(tl.int32, bitcast=True) & -0x80000000        # -0.0 stays -0.0
    return (r.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def _quantize_rows(x, FP8_MAX: tl.constexpr):
    """Rows of ``x`` (fp32) as e4m3 values and their scales ``amax / FP8_MAX``."""
    amax = tl.max(tl.abs(x), axis=1)
    scale = tl.where(amax > 0, tl.div_rn(amax, FP8_MAX), 1.0)  # IEEE, as torch divides
    scaled = tl.clamp(tl.div_rn(x, scale[:, None]), -FP8_MAX, FP8_MAX)  # saturate
    return _round_to_e4m3(scaled).to(tl.float8e4nv), scale    # the cast is exact


# %% chapters/13_fp8_kv_cache.md § Writing: scale, saturate, round
@triton.jit
def _write_fp8_kernel(key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr,
                      v_scale_ptr, slot_ptr, num_slots, stride_kn, stride_kh,
                      stride_vn, stride_vh, stride_block, stride_token, stride_head,
                      stride_sblock, stride_shead,
                      BLOCK_SIZE: tl.constexpr, NUM_HEADS: tl.constexpr,
                      HEAD_DIM: tl.constexpr, HEADS_PAD: tl.constexpr,
                      DIM_PAD: tl.constexpr, FP8_MAX: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    heads = tl.arange(0, HEADS_PAD)
    dims = tl.arange(0, DIM_PAD)[None, :]
    slots = tl.full((HEADS_PAD,), 0, tl.int64) + slot
    head_ok = (heads < NUM_HEADS) & (slots >= 0) & (slots < num_slots)
    mask = head_ok[:, None] & (dims < HEAD_DIM)
    k = tl.load(key_ptr + token * stride_kn + heads[:, None] * stride_kh + dims,
                mask=mask, other=0.0).to(tl.float32)
    v = tl.load(value_ptr + token * stride_vn + heads[:, None] * stride_vh + dims,
                mask=mask, other=0.0).to(tl.float32)
    k8, k_scale = _quantize_rows(k, FP8_MAX)
    v8, v_scale = _quantize_rows(v, FP8_MAX)
    dst = block * stride_block + offset * stride_token + heads[:, None] * stride_head
    tl.store(k_cache_ptr + dst + dims, k8, mask=mask)
    tl.store(v_cache_ptr + dst + dims, v8, mask=mask)
    scale_dst = block * stride_sblock + heads * stride_shead + offset
    tl.store(k_scale_ptr + scale_dst, k_scale, mask=head_ok)
    tl.store(v_scale_ptr + scale_dst, v_scale, mask=head_ok)


# %% chapters/13_fp8_kv_cache.md § Reading back, and moving blocks
def _swap(src: Fp8PagedKVCache, dst: Fp8PagedKVCache, pairs) -> None:
    """Chapter 7's staged block copy, for the values seen as bytes, then the scales."""
    if not isinstance(dst, Fp8PagedKVCache):
        raise KVCacheError(f"an fp8 cache swaps with an fp8 pool, got "
                           f"{type(dst).__name__}")
    for values in (True, False):
        a, b = copy.copy(src), copy.copy(dst)   # shallow: same tensors, same geometry
        a.storage, b.storage = ((c.storage.view(torch.uint8) if values else c.scales)
                                for c in (src, dst))
        copy_blocks_between(a, b, pairs)


# %% chapters/13_fp8_kv_cache.md § Values in pairs of bytes
@triton.jit
def _e4m3_pairs(pairs, INTERPRETED: tl.constexpr):
    """Words of two e4m3 values (int16) as (low bytes, high bytes): fp16 on a GPU,
    fp32 under the interpreter; exact."""
    if INTERPRETED:  # move the bits into fp16's fields: the value times 2**-8
        low = ((pairs & 0x7F) << 7) | ((pairs & 0x80) << 8)
        high = ((pairs >> 1) & 0x3F80) | (pairs & -0x8000)
        return (low.to(tl.float16, bitcast=True).to(tl.float32) * 256.0,
                high.to(tl.float16, bitcast=True).to(tl.float32) * 256.0)
    return tl.inline_asm_elementwise(
        "{ .reg .b32 t; cvt.rn.f16x2.e4m3x2 t, $2; mov.b32 {$0, $1}, t; }",
        "=h,=h,h", [pairs], dtype=(tl.float16, tl.float16), is_pure=True, pack=1)


# %% chapters/13_fp8_kv_cache.md § Values in pairs of bytes
@triton.jit
def _attend_fp8_tiles(q, q_scale, k_ptr, v_pairs_ptr, ks_ptr, vs_ptr, table_row,
                      head_base, scale_head_base, start, end, stride_block,
                      stride_token, stride_sblock,
                      GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                      DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                      TILE: tl.constexpr, DOT_DTYPE: tl.constexpr,
                      FP32_PRECISION: tl.constexpr, INTERPRETED: tl.constexpr):
    """Chapter 8's online softmax over e4m3 K/V; the scales multiply scores and
    probabilities. ``q`` times ``q_scale`` (per row) is the query times the softmax
    scale, base 2. Returns ``m, l`` and the accumulators of the even and odd dims."""
    dims, halves = tl.arange(0, DIM_PAD), tl.arange(0, DIM_PAD // 2)
    tokens = tl.arange(0, TILE)
    m = tl.full([GROUP_PAD], -float("inf"), dtype=tl.float32)
    l = tl.zeros([GROUP_PAD], dtype=tl.float32)
    even = tl.zeros([GROUP_PAD, DIM_PAD // 2], dtype=tl.float32)
    odd = tl.zeros([GROUP_PAD, DIM_PAD // 2], dtype=tl.float32)
    for tile_start in range(start, end, TILE):
        positions = tile_start + tokens
        valid = positions < end
        block = tl.load(table_row + positions // BLOCK_SIZE, mask=valid,
                        other=0).to(tl.int64)
        in_block = positions % BLOCK_SIZE
        rows = block * stride_block + in_block * stride_token + head_base
        scale_offsets = block * stride_sblock + scale_head_base + in_block
        k = tl.load(k_ptr + rows[:, None] + dims[None, :],
                    mask=valid[:, None] & (dims < HEAD_DIM)[None, :], other=0.0)
        k_scale = tl.load(ks_ptr + scale_offsets, mask=valid, other=0.0)
        scores = tl.dot(q, tl.trans(k.to(DOT_DTYPE)), input_precision=FP32_PRECISION)
        scores = scores * q_scale[:, None] * k_scale[None, :]
        scores = tl.where(valid[None, :], scores, -float("inf"))     # [GROUP_PAD, TILE]
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        pair_ok = valid[:, None] & (halves < HEAD_DIM // 2)[None, :]
        pairs = tl.load(v_pairs_ptr + rows[:, None] // 2 + halves[None, :],
                        mask=pair_ok, other=0)
        v_even, v_odd = _e4m3_pairs(pairs, INTERPRETED)
        v_scale = tl.load(vs_ptr + scale_offsets, mask=valid, other=0.0)
        v_top = tl.max(v_scale, axis=0)         # > 0: a tile holds a written row
        pv = (p * (v_scale / v_top)[None, :]).to(DOT_DTYPE)
        even = even * alpha[:, None] + v_top * tl.dot(
            pv, v_even.to(DOT_DTYPE), input_precision=FP32_PRECISION)
        odd = odd * alpha[:, None] + v_top * tl.dot(
            pv, v_odd.to(DOT_DTYPE), input_precision=FP32_PRECISION)
        m = m_new
    return m, l, even, odd


# %% chapters/13_fp8_kv_cache.md § Values in pairs of bytes
@triton.jit
def _fp8_decode_kernel(
        q_ptr, k_ptr, v_pairs_ptr, ks_ptr, vs_ptr, tables_ptr, lens_ptr, out_ptr,
        part_out_ptr, part_ml_ptr, scale_log2, min_split, num_splits, group,
        stride_qb, stride_qh, stride_ob, stride_oh, stride_table,
        stride_block, stride_token, stride_head, stride_sblock, stride_shead,
        GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
        BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, GRANULE: tl.constexpr,
        SPLIT: tl.constexpr, DOT_DTYPE: tl.constexpr, FP32_PRECISION: tl.constexpr,
        INTERPRETED: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    # this sequence's own range, as in chapter 8
    start, end = range_of_split(lens_ptr, b, split, num_splits, min_split, GRANULE)
    rows, dims = tl.arange(0, GROUP_PAD), tl.arange(0, DIM_PAD)
    row_ok = rows < group
    heads = kv_head * group + rows
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + dims[None, :],
                mask=row_ok[:, None] & (dims < HEAD_DIM)[None, :], other=0.0)
    q_top = tl.max(tl.abs(q.to(tl.float32)), axis=1)     # rows of at most 1 for fp16
    q_top = tl.where(q_top > 0, q_top, 1.0)
    m, l, even, odd = _attend_fp8_tiles(
        (q / q_top[:, None]).to(DOT_DTYPE), q_top * scale_log2, k_ptr, v_pairs_ptr,
        ks_ptr, vs_ptr, tables_ptr + b * stride_table, kv_head * stride_head,
        kv_head * stride_shead, start, end, stride_block, stride_token, stride_sblock,
        GROUP_PAD, HEAD_DIM, DIM_PAD, BLOCK_SIZE, TILE, DOT_DTYPE, FP32_PRECISION,
        INTERPRETED)
    norm = tl.where(l > 0, l, 1.0)[:, None]
    halves = tl.arange(0, DIM_PAD // 2)[None, :]
    mask = row_ok[:, None] & (halves < HEAD_DIM // 2)
    if not SPLIT:
        dst = out_ptr + b * stride_ob + heads[:, None] * stride_oh + 2 * halves
        tl.store(dst, (even / norm).to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(dst + 1, (odd / norm).to(out_ptr.dtype.element_ty), mask=mask)
    else:                                   # chapter 8's partial results, merged after
        part = (b * group * tl.num_programs(1) + heads) * num_splits + split
        dst = part_out_ptr + part[:, None] * DIM_PAD + 2 * halves
        tl.store(dst, even / norm, mask=mask)
        tl.store(dst + 1, odd / norm, mask=mask)
        tl.store(part_ml_ptr + 2 * part, m, mask=row_ok)
        tl.store(part_ml_ptr + 2 * part + 1, l, mask=row_ok)


# %% chapters/13_fp8_kv_cache.md § Values in pairs of bytes
class Fp8Launch(NamedTuple):
    """How the fp8 decode kernel is launched."""
    tile: int                           # tokens per loop step
    warps: int
    stages: int                         # Triton's software-pipeline stages
    dot_dtype: tl.dtype                 # what tl.dot multiplies
    max_registers: int | None = None    # registers a thread, capped: more programs
    programs_per_sm: int = 2            # what the split-KV factor aims at


def _fp8_launch_config(head_dim: int, device: torch.device, split: bool,
                       dtype: torch.dtype) -> Fp8Launch:
    """The fp8 decode kernel's launch for a query of ``dtype``."""
    if device.type != "cuda" or dtype == torch.float32:    # fp32 tiles: chapter 8's
        return Fp8Launch(*decode_launch_config(head_dim, device, split), tl.float32)
    if head_dim > 128:
        return Fp8Launch(64, 4, 3, tl.float16)
    return Fp8Launch(128, 4, 3, tl.float16, max_registers=128,  # measured on the H200,
                     programs_per_sm=4)                          # see below


# %% chapters/13_fp8_kv_cache.md § The engine with kv_cache_dtype
def new_fp8_cache(model, num_blocks: int, block_size: int) -> Fp8PagedKVCache:
    """An empty ``Fp8PagedKVCache`` for ``model``; a ``KVCacheError`` where FP8 is missing."""
    c, device = model.config, model.device
    if not fp8_supported(device):
        raise KVCacheError(f"kv_cache_dtype='fp8' needs FP8 (a GPU of compute "
                          f"capability 8.9 or newer), which {device} lacks: use "
                          f"kv_cache_dtype='auto'")
    return Fp8PagedKVCache(c.num_hidden_layers, num_blocks, block_size,
                           c.num_key_value_heads, c.head_dim, device)


def fp8_block_bytes(model, block_size: int) -> int:
    """Bytes of one block of ``new_fp8_cache``: e4m3 values and their fp32 scales."""
    c = model.config
    return block_bytes(fp8_bytes_per_token(c.num_hidden_layers, c.num_key_value_heads,
                                           c.head_dim), block_size)
