# GENERATED from chapters/03_block_tables.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/03_block_tables.md § Translating one position
"""Block tables: positions to slots and back, one at a time or for a whole batch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
import torch

from minipaged.memory.sizing import block_table_entries, ceil_div

__all__ = [
    "BlockTableError", "BlockAddress", "locate", "physical_address", "slot_for",
    "slot_to_address", "blocks_needed", "needs_new_block", "last_block_waste",
    "pad_block_tables", "slots_for_positions", "slots_for_range", "block_size_sweep",
    "memory_map",
]


class BlockTableError(IndexError):
    """A position its table does not cover (allocate a block first), or a bad table."""


class BlockAddress(NamedTuple):
    """Where a token lives: a physical block and the offset inside it."""

    block: int
    offset: int


def _check_block_size(block_size: int) -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, int) \
            or block_size <= 0:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    return block_size


def locate(position: int | torch.Tensor, block_size: int) -> tuple:
    """(logical block, offset) of a position: ``divmod(position, block_size)``."""
    _check_block_size(block_size)
    return position // block_size, position % block_size


def physical_address(block_table: Sequence[int], position: int,
                     block_size: int) -> BlockAddress:
    """The physical block and offset holding ``position`` of a sequence."""
    if position < 0:
        raise BlockTableError(f"position must be >= 0, got {position}")
    logical, offset = locate(position, block_size)
    if logical >= len(block_table):
        raise BlockTableError(
            f"position {position} is in logical block {logical}, but the table has "
            f"only {len(block_table)} entries ({len(block_table) * block_size} slots): "
            "allocate a block first")
    return BlockAddress(int(block_table[logical]), int(offset))


# %% chapters/03_block_tables.md § Translating one position
def slot_for(block_table: Sequence[int], position: int, block_size: int) -> int:
    """The flat slot ``block * block_size + offset`` that holds ``position``."""
    block, offset = physical_address(block_table, position, block_size)
    return block * block_size + offset


def slot_to_address(slot: int | torch.Tensor, block_size: int) -> tuple:
    """Back from a flat slot to (physical block, offset); ints or tensors.

    An int slot must be >= 0 (-1 marks padding). Tensors are converted element-wise
    without checks, so mask padded slots before using the result.
    """
    block, offset = locate(slot, block_size)
    if isinstance(slot, int):
        if slot < 0:
            raise BlockTableError(f"slot must be >= 0, got {slot} (-1 marks padding)")
        return BlockAddress(block, offset)
    return block, offset


def blocks_needed(length: int, block_size: int) -> int:
    """Table entries a sequence of ``length`` tokens needs: ceil(length / block_size).

    The count chapter 1 called ``block_table_entries``, under the block manager's name.
    """
    return block_table_entries(length, block_size)


def needs_new_block(length: int, block_size: int) -> bool:
    """True if the next token of a ``length``-token sequence starts a new block."""
    return length % _check_block_size(block_size) == 0


def last_block_waste(length: int, block_size: int) -> int:
    """Empty slots in the last block: 0 if ``length % B == 0``, else ``B - length % B``.
    """
    return blocks_needed(length, block_size) * block_size - length


# %% chapters/03_block_tables.md § A whole batch at once
def pad_block_tables(tables: Sequence[Sequence[int]], pad_value: int = -1,
                     device: torch.device | str | None = None) -> torch.Tensor:
    """The tables of a batch as one ``[num_seqs, max_blocks]`` int32 tensor, padded.

    Entries past a row's own table are padding, which no reader may use (readers stop at
    the sequence's length); -1 makes a lookup that reaches padding fail loudly.
    """
    width = max((len(t) for t in tables), default=0)
    out = torch.full((len(tables), width), pad_value, dtype=torch.int32)
    for row, table in enumerate(tables):
        if len(table):
            out[row, :len(table)] = torch.as_tensor(table, dtype=torch.int32)
    return out.to(device) if device is not None else out


def slots_for_positions(block_tables: torch.Tensor, positions: torch.Tensor,
                        block_size: int,
                        rows: torch.Tensor | None = None) -> torch.Tensor:
    """Flat slots (int64) of ``positions[i]`` in row ``rows[i]`` of ``block_tables``.

    ``rows`` defaults to ``0..N-1`` (one position per sequence: a decode step). A
    negative position gives slot -1 (a padded token: the cache write skips it). Raises
    ``BlockTableError`` if a position lies beyond its table or on a negative entry.
    """
    _check_block_size(block_size)
    positions = positions.to(torch.int64)
    if rows is None:
        rows = torch.arange(positions.numel(), device=positions.device)
    valid = positions >= 0
    logical, offset = locate(positions.clamp(min=0), block_size)
    width = block_tables.shape[1]
    if bool((valid & (logical >= width)).any()):
        bad = int(positions[valid & (logical >= width)][0])
        raise BlockTableError(f"position {bad} needs logical block "
                              f"{bad // block_size}, but the tables have {width} "
                              "columns: allocate a block first")
    physical = block_tables[rows, logical.clamp(max=max(width - 1, 0))].to(torch.int64)
    if bool((valid & (physical < 0)).any()):
        bad = int(positions[valid & (physical < 0)][0])
        raise BlockTableError(f"position {bad} maps to a padding entry of its block "
                              "table: allocate a block first")
    return torch.where(valid, physical * block_size + offset,
                       torch.full_like(positions, -1))


def slots_for_range(block_table: Sequence[int] | torch.Tensor, start: int, count: int,
                    block_size: int) -> torch.Tensor:
    """Slots of positions ``start .. start+count-1`` of one sequence (a prefill)."""
    table = torch.as_tensor(block_table, dtype=torch.int32).reshape(1, -1)
    positions = torch.arange(start, start + count, dtype=torch.int64)
    return slots_for_positions(table, positions, block_size,
                               rows=torch.zeros_like(positions))


# %% chapters/03_block_tables.md § Choosing a block size
def block_size_sweep(lengths: Sequence[int], block_sizes: Sequence[int]) -> list[dict]:
    """For each block size: last-block waste (total, and as a share of allocated slots),
    mean and largest table length, and blocks needed, for sequences of these lengths.
    """
    lengths_np = np.asarray(lengths, dtype=np.int64)
    if lengths_np.size == 0 or (lengths_np < 1).any():
        raise ValueError("lengths must be a non-empty list of positive token counts")
    rows = []
    for block_size in block_sizes:
        _check_block_size(int(block_size))
        blocks = ceil_div(lengths_np, block_size)
        allocated = int(blocks.sum()) * block_size
        rows.append({
            "block_size": int(block_size),
            "blocks_needed": int(blocks.sum()),
            "waste_tokens": allocated - int(lengths_np.sum()),
            "waste_share": (allocated - int(lengths_np.sum())) / allocated,
            "mean_table_len": float(blocks.mean()),
            "max_table_len": int(blocks.max()),
        })
    return rows


# %% chapters/03_block_tables.md § A memory map
def memory_map(tables: Mapping[object, Sequence[int]], num_blocks: int) -> np.ndarray:
    """Owner of every physical block: the index (in ``tables`` order) of the sequence
    whose table holds it, or -1 if free. Raises ``BlockTableError`` if a block is out of
    range or in two tables."""
    owner = np.full(num_blocks, -1, dtype=np.int64)
    for index, (seq, table) in enumerate(tables.items()):
        for block in table:
            if not 0 <= block < num_blocks:
                raise BlockTableError(
                    f"sequence {seq!r}: block {block} is outside 0..{num_blocks - 1}")
            if owner[block] != -1:
                other = list(tables)[owner[block]]
                raise BlockTableError(
                    f"block {block} is in the tables of both {other!r} and {seq!r}")
            owner[block] = index
    return owner
