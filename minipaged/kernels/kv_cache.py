# GENERATED from chapters/07_paged_kv_cache.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/07_paged_kv_cache.md § The idea: one tensor, addressed by slot
"""The paged KV cache: fixed-size blocks per layer, written at slots, read by table."""

from __future__ import annotations

from typing import Iterable, Sequence

import torch

from minipaged.runtime import tl, triton  # Triton, or its stand-in (chapter 0)

from minipaged.runtime import default_device
from minipaged.memory.sizing import DTYPE_BYTES, block_bytes, blocks_in_budget, kv_bytes_per_token

__all__ = [
    "PagedKVCache",
    "KVCacheError",
    "LAYOUTS",
    "ATTENTION_BACKENDS",
    "write_kv_reference",
    "copy_blocks_reference",
    # shared with chapter 13's FP8 cache
    "block_pairs",
    "copy_blocks_kernel",
    "copy_blocks_between",
]

LAYOUTS = ("NHD", "HND")
ATTENTION_BACKENDS = ("triton", "torch")
"""The implementations of the cache's operations, by name: the Triton kernels, or plain
PyTorch (the references, which are fast on a CPU where Triton only interprets)."""


class KVCacheError(ValueError):
    """A call to the KV cache with arguments that do not fit it (shape, dtype, slot)."""


# %% chapters/07_paged_kv_cache.md § The idea: one tensor, addressed by slot
class PagedKVCache:
    """Keys and values of every layer in fixed-size blocks: ``storage[layer, 0|1]``.

    ``layout="NHD"`` stores a layer's K as ``[num_blocks, block_size, num_kv_heads,
    head_dim]``, ``"HND"`` as ``[num_blocks, num_kv_heads, block_size, head_dim]``.
    Slot ``s`` is token ``s % block_size`` of block ``s // block_size``.
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int,
                 num_kv_heads: int, head_dim: int, dtype: torch.dtype = torch.float16,
                 device: torch.device | str | None = None, layout: str = "NHD",
                 pin_memory: bool = False) -> None:
        for name, value in (("num_layers", num_layers), ("num_blocks", num_blocks),
                            ("block_size", block_size), ("num_kv_heads", num_kv_heads),
                            ("head_dim", head_dim)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise KVCacheError(f"{name} must be a positive integer, got {value!r}")
        if layout not in LAYOUTS:
            raise KVCacheError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if dtype not in DTYPE_BYTES:
            raise KVCacheError(f"unsupported cache dtype {dtype}; use one of "
                               f"float32/float16/bfloat16")
        self.num_layers, self.num_blocks = num_layers, num_blocks
        self.block_size = block_size
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        self.dtype, self.layout = dtype, layout
        self.device = torch.device(device) if device is not None else default_device()
        inner = ((block_size, num_kv_heads, head_dim) if layout == "NHD"
                 else (num_kv_heads, block_size, head_dim))
        self.storage = torch.zeros((num_layers, 2, num_blocks, *inner), dtype=dtype,
                                   device=self.device, pin_memory=pin_memory)
        self.attention_backend = "triton"  # one of ATTENTION_BACKENDS; an engine sets it

    @classmethod
    def from_budget(cls, budget_bytes: int, num_layers: int, block_size: int,
                    num_kv_heads: int, head_dim: int,
                    dtype: torch.dtype = torch.float16,
                    device: torch.device | str | None = None,
                    layout: str = "NHD") -> "PagedKVCache":
        """As many whole blocks as fit in ``budget_bytes`` (chapter 1's sizing)."""
        per_token = kv_bytes_per_token(num_layers, num_kv_heads, head_dim,
                                       DTYPE_BYTES[dtype])
        num_blocks = blocks_in_budget(budget_bytes, block_bytes(per_token, block_size))
        if num_blocks == 0:
            raise KVCacheError(f"a budget of {budget_bytes} bytes holds no block of "
                               f"{block_bytes(per_token, block_size)} bytes; raise it "
                               f"or shrink blocks")
        return cls(num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype,
                   device, layout)

    def __repr__(self) -> str:
        return (f"PagedKVCache(layers={self.num_layers}, blocks={self.num_blocks}, "
                f"block_size={self.block_size}, kv_heads={self.num_kv_heads}, "
                f"head_dim={self.head_dim}, dtype={self.dtype}, "
                f"layout={self.layout!r}, "
                f"device={self.device}, {self.nbytes / 2**20:.1f} MiB)")

    # %% chapters/07_paged_kv_cache.md § The idea: one tensor, addressed by slot
    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def nbytes(self) -> int:
        return self.storage.numel() * self.storage.element_size()

    def key_cache(self, layer: int) -> torch.Tensor:
        """Layer ``layer``'s K in the cache's own layout (a view)."""
        return self.storage[self._layer(layer), 0]

    def value_cache(self, layer: int) -> torch.Tensor:
        """Layer ``layer``'s V in the cache's own layout (a view)."""
        return self.storage[self._layer(layer), 1]

    def token_view(self, tensor: torch.Tensor) -> torch.Tensor:
        """A layer's K or V seen as ``[blocks, block_size, heads, head_dim]``."""
        return tensor if self.layout == "NHD" else tensor.transpose(1, 2)

    def strides(self) -> tuple[int, int, int]:
        """Element strides (block, token-in-block, head) of one layer's K (and V)."""
        view = self.token_view(self.key_cache(0))
        return view.stride(0), view.stride(1), view.stride(2)

    def _layer(self, layer: int) -> int:
        if not 0 <= layer < self.num_layers:
            raise KVCacheError(f"layer {layer} out of range: this cache has "
                               + f"{self.num_layers} layers")
        return layer

    # %% chapters/07_paged_kv_cache.md § Writing new tokens at their slots
    def _checked_kv(self, name: str, tensor: torch.Tensor, num_tokens: int) -> torch.Tensor:
        expected = (num_tokens, self.num_kv_heads, self.head_dim)
        if tuple(tensor.shape) != expected:
            raise KVCacheError(f"{name} must have shape [N, num_kv_heads, head_dim] = "
                               + f"{list(expected)}, got {list(tensor.shape)}")
        if tensor.device != self.storage.device:
            raise KVCacheError(f"{name} is on {tensor.device} but the cache is on "
                               + f"{self.storage.device}")
        if not tensor.dtype.is_floating_point:
            raise KVCacheError(f"{name} must be a floating-point tensor, "
                               + f"got {tensor.dtype}")
        return tensor if tensor.stride(-1) == 1 else tensor.contiguous()

    def write(self, layer: int, key: torch.Tensor, value: torch.Tensor,
              slot_mapping: torch.Tensor, check_slots: bool | None = None) -> None:
        """Store ``key[i]``, ``value[i]`` (each ``[N, H_kv, D]``) at ``slot_mapping[i]``.

        Slot -1 skips. With ``check_slots`` (default: when ``slot_mapping`` is on the CPU)
        a slot outside ``[-1, num_slots)`` raises ``KVCacheError`` before anything is
        written; without it such a slot is skipped by the kernel, never written.
        """
        self._layer(layer)
        if slot_mapping.dim() != 1 or slot_mapping.dtype not in (torch.int32, torch.int64):
            raise KVCacheError(f"slot_mapping must be a 1-D int32/int64 tensor, got "
                               + f"{slot_mapping.dtype} of shape "
                               + f"{list(slot_mapping.shape)}")
        num_tokens = slot_mapping.shape[0]
        key = self._checked_kv("key", key, num_tokens)
        value = self._checked_kv("value", value, num_tokens)
        if check_slots is None:
            check_slots = slot_mapping.device.type == "cpu"
        if check_slots and num_tokens:
            low, high = (int(s) for s in slot_mapping.aminmax())
            if low < -1 or high >= self.num_slots:
                raise KVCacheError(f"slot_mapping holds slots in [{low}, {high}] but this "
                                   + f"cache has slots 0..{self.num_slots - 1} "
                                   + "(and -1 for 'skip')")
        if num_tokens == 0:
            return
        slot_mapping = slot_mapping.to(self.storage.device)
        if self.attention_backend == "torch":
            write_kv_reference(self, layer, key, value, slot_mapping)
            return
        stride_block, stride_token, stride_head = self.strides()
        _write_kv_kernel[(num_tokens,)](
            key, value, self.key_cache(layer), self.value_cache(layer), slot_mapping,
            self.num_slots, key.stride(0), key.stride(1), value.stride(0), value.stride(1),
            stride_block, stride_token, stride_head,
            BLOCK_SIZE=self.block_size, NUM_HEADS=self.num_kv_heads, HEAD_DIM=self.head_dim,
            HEADS_PAD=triton.next_power_of_2(self.num_kv_heads),
            DIM_PAD=triton.next_power_of_2(self.head_dim))

    # %% chapters/07_paged_kv_cache.md § Reading a sequence back: gather
    def gather(self, layer: int, block_table: Sequence[int] | torch.Tensor,
               num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of one sequence, ``[num_tokens, H_kv, D]`` each, contiguous, in order."""
        table = torch.as_tensor(block_table, dtype=torch.long).to(self.storage.device)
        if table.dim() != 1:
            raise KVCacheError(f"block_table must be 1-D (one sequence), got shape "
                               + f"{list(table.shape)}")
        if not 0 <= num_tokens <= table.numel() * self.block_size:
            raise KVCacheError(f"{num_tokens} tokens do not fit in {table.numel()} blocks "
                               + f"of {self.block_size}")
        positions = torch.arange(num_tokens, device=self.storage.device)
        blocks = table[positions // self.block_size]
        offsets = positions % self.block_size
        key = self.token_view(self.key_cache(layer))[blocks, offsets]
        value = self.token_view(self.value_cache(layer))[blocks, offsets]
        return key.contiguous(), value.contiguous()

    # %% chapters/07_paged_kv_cache.md § Copying blocks: copy-on-write
    def copy_blocks(self, pairs: Iterable[tuple[int, int]] | torch.Tensor) -> None:
        """Copy-on-write: for every ``(src, dst)``, block ``dst`` := block ``src``.

        No destination may appear twice or also be a source (raises ``KVCacheError``, copies
        nothing). The pairs are validated on the CPU, then one launch copies all of them.
        """
        pairs = block_pairs(self, pairs)
        if {dst for _, dst in pairs} & {src for src, _ in pairs}:
            raise KVCacheError(f"a block is both a source and a destination in {pairs}: "
                               + f"split the copy")
        if not pairs:
            return
        if self.attention_backend == "torch":
            copy_blocks_reference(self, pairs)
            return
        block_numel = self.block_size * self.num_kv_heads * self.head_dim
        chunk = min(4096, triton.next_power_of_2(block_numel))
        table = torch.tensor(pairs, dtype=torch.int64, device=self.storage.device)
        grid = (len(pairs), 2 * self.num_layers, triton.cdiv(block_numel, chunk))
        copy_blocks_kernel[grid](self.storage, table, self.num_blocks * block_numel,
                                  block_numel, CHUNK=chunk)

    # %% chapters/07_paged_kv_cache.md § Swapping to CPU memory
    def cpu_pool(self, num_blocks: int) -> "PagedKVCache":
        """A host-memory pool of ``num_blocks`` blocks shaped like this one (pinned)."""
        return PagedKVCache(self.num_layers, num_blocks, self.block_size, self.num_kv_heads,
                            self.head_dim, self.dtype, "cpu", self.layout,
                            pin_memory=self.storage.device.type == "cuda")

    def swap_out(self, cpu_cache: "PagedKVCache",
                 pairs: Iterable[tuple[int, int]] | torch.Tensor) -> None:
        """Copy blocks ``(gpu_block, cpu_block)`` of this cache into ``cpu_cache``."""
        copy_blocks_between(self, cpu_cache, pairs)

    def swap_in(self, cpu_cache: "PagedKVCache",
                pairs: Iterable[tuple[int, int]] | torch.Tensor) -> None:
        """Copy blocks ``(cpu_block, gpu_block)`` of ``cpu_cache`` back into this cache."""
        copy_blocks_between(cpu_cache, self, pairs)


# %% chapters/07_paged_kv_cache.md § Writing new tokens at their slots
def write_kv_reference(cache: PagedKVCache, layer: int, key: torch.Tensor,
                       value: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Plain-PyTorch ``cache.write``: token ``i`` goes to slot ``slot_mapping[i]``."""
    slots = slot_mapping.long()
    if len(slots) == 0:
        return
    low, high = slots.aminmax()  # the usual step: every slot valid, no boolean indexing
    if int(low) < 0 or int(high) >= cache.num_slots:
        keep = (slots >= 0) & (slots < cache.num_slots)
        slots, key, value = slots[keep], key[keep], value[keep]
    for tensor, new in ((cache.key_cache(layer), key), (cache.value_cache(layer), value)):
        new = new.to(cache.dtype)
        if cache.layout == "NHD":  # slot s is row s of the layer seen as [slots, H, D]
            tensor.view(cache.num_slots, *tensor.shape[2:]).index_copy_(0, slots, new)
        else:
            block, offset = slots // cache.block_size, slots % cache.block_size
            cache.token_view(tensor)[block, offset] = new


# %% chapters/07_paged_kv_cache.md § Writing new tokens at their slots
@triton.jit
def _write_kv_kernel(key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, num_slots,
                     stride_kn, stride_kh, stride_vn, stride_vh,
                     stride_block, stride_token, stride_head,
                     BLOCK_SIZE: tl.constexpr, NUM_HEADS: tl.constexpr,
                     HEAD_DIM: tl.constexpr, HEADS_PAD: tl.constexpr,
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
    dst = block * stride_block + offset * stride_token + heads * stride_head + dims
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


# %% chapters/07_paged_kv_cache.md § Copying blocks: copy-on-write
def block_pairs(cache: PagedKVCache, pairs: Iterable[tuple[int, int]] | torch.Tensor,
                num_dst_blocks: int | None = None) -> list[tuple[int, int]]:
    """Validate (src, dst) block pairs against this cache (and a destination's size)."""
    if isinstance(pairs, torch.Tensor):
        pairs = pairs.tolist()
    pairs = [(int(src), int(dst)) for src, dst in pairs]
    num_dst_blocks = cache.num_blocks if num_dst_blocks is None else num_dst_blocks
    for src, dst in pairs:
        if not (0 <= src < cache.num_blocks and 0 <= dst < num_dst_blocks):
            raise KVCacheError(f"pair ({src}, {dst}) out of range: source blocks "
                               f"0..{cache.num_blocks - 1}, destination blocks "
                               f"0..{num_dst_blocks - 1}")
    dsts = [dst for _, dst in pairs]
    if len(set(dsts)) != len(dsts):
        raise KVCacheError(f"a destination block appears twice in {pairs}")
    return pairs


def copy_blocks_reference(cache: PagedKVCache,
                          pairs: Iterable[tuple[int, int]]) -> None:
    """Plain-PyTorch ``cache.copy_blocks``: block ``dst`` := block ``src``, K and V."""
    pairs = block_pairs(cache, pairs)
    if pairs:
        src, dst = (torch.tensor(x, device=cache.storage.device) for x in zip(*pairs))
        cache.storage[:, :, dst] = cache.storage[:, :, src]


@triton.jit
def copy_blocks_kernel(storage_ptr, pairs_ptr, stride_plane, block_numel,
                       CHUNK: tl.constexpr):
    pair = tl.program_id(0).to(tl.int64)
    plane = tl.program_id(1).to(tl.int64)            # layer * 2 + (0 for K, 1 for V)
    chunk = tl.program_id(2).to(tl.int64)
    src = tl.load(pairs_ptr + 2 * pair).to(tl.int64)
    dst = tl.load(pairs_ptr + 2 * pair + 1).to(tl.int64)
    offsets = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = offsets < block_numel
    base = storage_ptr + plane * stride_plane
    tl.store(base + dst * block_numel + offsets,
             tl.load(base + src * block_numel + offsets, mask=mask), mask=mask)


# %% chapters/07_paged_kv_cache.md § Swapping to CPU memory
def _check_same_geometry(a: PagedKVCache, b: PagedKVCache) -> None:
    fields = ("num_layers", "block_size", "num_kv_heads", "head_dim", "dtype", "layout")
    different = [f for f in fields if getattr(a, f) != getattr(b, f)]
    if different:
        raise KVCacheError(f"the two pools differ in {different}: a swap needs "
                           f"identical block shapes")


def copy_blocks_between(src_cache: PagedKVCache, dst_cache: PagedKVCache,
                        pairs: Iterable[tuple[int, int]] | torch.Tensor) -> None:
    """Blocks ``(src, dst)`` of ``src_cache`` into ``dst_cache``: gather, copy, scatter.

    Between a GPU and the host the transfer goes through a page-locked staging tensor,
    so that it is one DMA copy at full link speed.
    """
    _check_same_geometry(src_cache, dst_cache)
    pairs = block_pairs(src_cache, pairs, num_dst_blocks=dst_cache.num_blocks)
    if not pairs:
        return
    src_storage, dst_storage = src_cache.storage, dst_cache.storage
    src, dst = (torch.tensor(x) for x in zip(*pairs))
    src_dev, dst_dev = src_storage.device, dst_storage.device
    if src_dev.type == "cuda" and dst_dev.type == "cpu":                     # swap out
        gathered = src_storage.index_select(2, src.to(src_dev))
        staged = torch.empty(gathered.shape, dtype=gathered.dtype, pin_memory=True)
        staged.copy_(gathered, non_blocking=True)
        torch.cuda.current_stream(src_dev).synchronize()     # the host reads it next
        dst_storage.index_copy_(2, dst, staged)
    elif src_dev.type == "cpu" and dst_dev.type == "cuda":                   # swap in
        shape = (*src_storage.shape[:2], len(pairs), *src_storage.shape[3:])
        staged = torch.empty(shape, dtype=src_storage.dtype, pin_memory=True)
        torch.index_select(src_storage, 2, src, out=staged)  # gather into pinned memory
        dst_storage.index_copy_(2, dst.to(dst_dev),
                                staged.to(dst_dev, non_blocking=True))
    else:                                                    # one device (or two GPUs)
        moved = src_storage.index_select(2, src.to(src_dev)).to(dst_dev)
        dst_storage.index_copy_(2, dst.to(dst_dev), moved)
