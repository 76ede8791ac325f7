"""Chapter 4 reference solutions."""


def conserved(num_blocks: int, free_blocks: list[int], tables: dict[str, list[int]]) -> bool:
    everywhere = list(free_blocks) + [block for table in tables.values() for block in table]
    return sorted(everywhere) == list(range(num_blocks))


def blocks_for_step(lengths: list[int], new_tokens: list[int], block_size: int) -> int:
    def ceil(a: int) -> int:
        return -(-a // block_size)
    return sum(ceil(length + n) - ceil(length) for length, n in zip(lengths, new_tokens))


def decode_slot_mapping(tables: list[list[int]], lengths: list[int], block_size: int) -> list[int]:
    return [table[length // block_size] * block_size + length % block_size
            for table, length in zip(tables, lengths)]
