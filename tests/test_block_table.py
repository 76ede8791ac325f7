"""Chapter 3: address translation, batched slot mapping, waste, the block-size sweep, memory maps."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged.memory.block_table import (BlockAddress, BlockTableError, block_size_sweep,
                                          blocks_needed, last_block_waste, locate, memory_map,
                                          needs_new_block, pad_block_tables, physical_address,
                                          slot_for, slot_to_address, slots_for_positions,
                                          slots_for_range)

block_sizes = st.integers(1, 64)


@given(slot=st.integers(0, 10**9), block_size=block_sizes)
def test_slot_round_trip(slot, block_size):
    block, offset = slot_to_address(slot, block_size)
    assert 0 <= offset < block_size and block * block_size + offset == slot


@given(st.data())
def test_position_slot_address_round_trip(data):
    block_size = data.draw(block_sizes)
    table = data.draw(st.lists(st.integers(0, 10_000), min_size=1, max_size=20, unique=True))
    position = data.draw(st.integers(0, len(table) * block_size - 1))
    slot = slot_for(table, position, block_size)
    assert slot_to_address(slot, block_size) == physical_address(table, position, block_size)
    assert slot_to_address(slot, block_size) == BlockAddress(table[position // block_size],
                                                             position % block_size)


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_batched_slots_match_scalar_and_round_trip(data):
    block_size = data.draw(st.integers(1, 8))
    lengths = data.draw(st.lists(st.integers(0, 30), min_size=1, max_size=6))
    needed = [blocks_needed(n, block_size) for n in lengths]
    pool = data.draw(st.permutations(range(sum(needed) + 3)))
    tables, used = [], 0
    for count in needed:
        tables.append(list(pool[used:used + count]))
        used += count
    padded = pad_block_tables(tables)
    rows = torch.tensor([r for r, n in enumerate(lengths) for _ in range(n)], dtype=torch.int64)
    positions = torch.tensor([p for n in lengths for p in range(n)], dtype=torch.int64)
    slots = slots_for_positions(padded, positions, block_size, rows=rows)
    assert slots.dtype == torch.int64
    assert slots.tolist() == [slot_for(tables[r], p, block_size)
                              for r, p in zip(rows.tolist(), positions.tolist())]
    assert len(set(slots.tolist())) == len(slots)          # disjoint tables: no shared slot
    block, offset = slot_to_address(slots, block_size)
    assert (block * block_size + offset == slots).all() and (offset == positions % block_size).all()


def test_worked_examples_of_the_chapter():
    assert [physical_address([7, 1], t, 4) for t in (0, 3, 4, 6)] == [(7, 0), (7, 3), (1, 0), (1, 2)]
    assert physical_address([7, 1], 7, 4) == (1, 3) and needs_new_block(8, 4)
    with pytest.raises(BlockTableError, match="allocate a block first"):
        physical_address([7, 1], 8, 4)
    assert slot_for([7, 1, 3], 8, 4) == 12
    assert slot_for([5, 2, 9, 1], 6, 4) == 10
    assert [slot_for([5, 2, 9], t, 4) for t in (0, 6, 11)] == [20, 10, 39]
    assert last_block_waste(10, 4) == 2


@given(length=st.integers(0, 100_000), block_size=block_sizes)
def test_last_block_waste_formula(length, block_size):
    waste = last_block_waste(length, block_size)
    assert 0 <= waste < block_size and (length + waste) % block_size == 0
    assert waste == (0 if length % block_size == 0 else block_size - length % block_size)
    assert blocks_needed(length, block_size) * block_size == length + waste


def test_batch_edge_cases():
    padded = pad_block_tables([[3, 4], [], [0]])
    assert padded.tolist() == [[3, 4], [-1, -1], [0, -1]] and padded.dtype == torch.int32
    assert slots_for_positions(padded, torch.tensor([5, -1, 1]), 4).tolist() == [17, -1, 1]
    with pytest.raises(BlockTableError, match="padding"):
        slots_for_positions(padded, torch.tensor([0, 0, 0]), 4)
    with pytest.raises(BlockTableError, match="allocate a block first"):
        slots_for_positions(padded, torch.tensor([8, -1, 0]), 4)
    assert slots_for_range([5, 2, 9], 2, 7, 4).tolist() == [22, 23, 8, 9, 10, 11, 36]
    assert pad_block_tables([]).shape == (0, 0)
    with pytest.raises(ValueError, match="block_size"):
        locate(3, 0)
    with pytest.raises(BlockTableError):
        slot_to_address(-1, 4)


def test_block_size_sweep():
    rows = block_size_sweep([1, 4, 5, 16], [1, 4, 16])
    assert [r["blocks_needed"] for r in rows] == [26, 1 + 1 + 2 + 4, 4]
    assert [r["waste_tokens"] for r in rows] == [0, 3 + 0 + 3 + 0, 15 + 12 + 11 + 0]
    assert rows[2]["max_table_len"] == 1 and rows[0]["mean_table_len"] == pytest.approx(6.5)
    with pytest.raises(ValueError):
        block_size_sweep([0, 3], [4])


def test_memory_map():
    owner = memory_map({"A": [2, 0], "B": [3]}, 5)
    assert owner.tolist() == [0, -1, 0, 1, -1]
    with pytest.raises(BlockTableError, match="both 'A' and 'B'"):
        memory_map({"A": [1], "B": [1]}, 4)
    with pytest.raises(BlockTableError, match="outside"):
        memory_map({"A": [4]}, 4)


def test_memory_map_owners_free_blocks_and_errors():
    owner = memory_map({"A": [3, 0], "B": [], "C": [1]}, 5)
    assert owner.tolist() == [0, 2, -1, 0, -1]                 # index of the owning sequence, -1 free
    with pytest.raises(BlockTableError, match="both 'A' and 'C'"):
        memory_map({"A": [1, 2], "B": [], "C": [2]}, 4)
    with pytest.raises(BlockTableError, match="outside 0..3"):
        memory_map({"A": [4]}, 4)
    with pytest.raises(BlockTableError, match="outside"):
        memory_map({"A": [-1]}, 4)


def test_every_public_name_is_importable_from_its_module():
    import minipaged
    import minipaged.memory.block_table as block_table

    missing = [n for n in block_table.__all__ if not hasattr(block_table, n)]
    assert not missing, f"in minipaged.memory.block_table.__all__ but not defined: {missing}"
    assert block_table.slots_for_positions is slots_for_positions
    # not a top-level name (chapter 3 lists no `api:`); the error says where to import it from
    with pytest.raises(AttributeError, match="from minipaged.memory.block_table import slots_for_"):
        minipaged.slots_for_positions  # noqa: B018
