"""Chapter 3 reference solutions."""

from collections import Counter


def address(block_table: list[int], position: int, block_size: int) -> tuple[int, int]:
    logical, offset = divmod(position, block_size)
    return block_table[logical], offset


def last_block_waste(length: int, block_size: int) -> int:
    return -length % block_size


def pool_is_consistent(tables: dict[str, list[int]], free: list[int], num_blocks: int) -> bool:
    counts = Counter(free)
    for table in tables.values():
        counts.update(table)
    return counts == Counter(range(num_blocks))
