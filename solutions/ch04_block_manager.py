"""Chapter 4 reference solutions."""

from minipaged.memory.block_manager import TeachingBlockManager


def boundary_rule_counterexamples() -> dict[str, tuple[list[int], list[int], int]]:
    # several tokens in one step can cross more than one boundary, or start inside a block and
    # cross one; a sequence on a boundary that gets no token this step needs nothing
    return {"under": ([5], [8], 4),     # positions 5..12 touch blocks 2 and 3: 2 new, rule 0
            "over": ([4, 6], [0, 1], 4)}  # the first sequence waits: 0 new, rule 1


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
