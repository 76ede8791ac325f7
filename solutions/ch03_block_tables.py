"""Chapter 3 reference solutions."""

from collections import Counter


def counterexamples() -> dict[str, tuple[list[int], int, int]]:
    # a table that is not the identity, a block size that is not the table's length, and a
    # position whose logical block differs from its offset
    return {"logical": ([5, 2, 9], 6, 4),          # right: (2, 2); the logical block says (1, 2)
            "swapped": ([5, 2, 9], 6, 4),          # the swap looks up entry 2 at offset 1: (9, 1)
            "offset_by_table": ([5, 2, 9], 7, 4)}  # offset 7 % 3 = 1, not 7 % 4 = 3


def predict_mean_waste() -> dict[int, float]:
    # every residue of the length modulo B occurs equally often in 1..4096, and the waste runs
    # over B - 1, ..., 1, 0: its mean is (B - 1) / 2
    return {1: 0.0, 16: 7.5, 256: 127.5}


def pool_is_consistent(tables: dict[str, list[int]], free: list[int], num_blocks: int) -> bool:
    counts = Counter(free)
    for table in tables.values():
        counts.update(table)
    return counts == Counter(range(num_blocks))


CANDIDATES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def choose_block_size(lengths: list[int], max_waste: float = 0.05,
                      max_table: float = 64) -> tuple[int, dict]:
    best = None
    for block_size in CANDIDATES:
        blocks = [-(-n // block_size) for n in lengths]
        allocated = sum(blocks) * block_size
        numbers = {"waste_share": (allocated - sum(lengths)) / allocated,
                   "mean_table_len": sum(blocks) / len(blocks)}
        if numbers["waste_share"] <= max_waste and numbers["mean_table_len"] <= max_table:
            best = (block_size, numbers)  # the largest that qualifies: fewest allocations
    if best is None:
        raise ValueError("no block size meets both limits")
    return best


def sentinel_check(make_manager) -> None:
    manager = make_manager(16, 2)
    cache = {}
    for position in range(7):                 # two sequences, interleaved
        for seq in ("a", "b"):
            slot = manager.append(seq)
            assert slot not in cache, f"slot {slot} written twice"
            cache[slot] = (seq, position)
    for seq in ("a", "b"):
        for position in range(7):
            got = cache.get(manager.slot(seq, position))
            assert got == (seq, position), f"{seq}[{position}] reads {got}"
