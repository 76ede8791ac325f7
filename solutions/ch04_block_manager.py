"""Chapter 4 reference solutions."""

from minipaged.block_manager import TeachingBlockManager


def blocks_for_step(lengths: list[int], new_tokens: list[int], block_size: int) -> int:
    def ceil(a: int) -> int:
        return -(-a // block_size)
    return sum(ceil(length + n) - ceil(length) for length, n in zip(lengths, new_tokens))


class AtomicTeachingManager(TeachingBlockManager):
    def step(self, requests: list) -> list[int]:
        free_list = list(self.free_list)
        saved = {r: (self.tables[r], self.lengths[r]) if r in self.tables else None
                 for r in requests}
        try:
            return [self.append(r) for r in requests]
        except BaseException:
            self.free_list[:] = free_list
            for r, entry in saved.items():
                if entry is None:
                    self.tables.pop(r, None)
                    self.lengths.pop(r, None)
                else:
                    self.tables[r], self.lengths[r] = entry
            raise
