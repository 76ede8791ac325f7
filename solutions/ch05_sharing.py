"""Chapter 5 reference solutions."""

from minipaged.memory.block_manager import NoFreeBlocksError, TeachingBlockManager


class SharingTeachingManager(TeachingBlockManager):
    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self.refcounts = [0] * num_blocks
        self.copies: list[tuple[int, int]] = []

    def _fresh_block(self, request) -> int:
        if not self.free_list:
            raise NoFreeBlocksError(1, 0, f"a token of request {request!r}")
        block = self.free_list.pop()
        self.refcounts[block] = 1
        return block

    def fork(self, request, new_request) -> None:
        if new_request in self.tables:
            raise ValueError(f"request {new_request!r} already exists")
        self.tables[new_request] = list(self.tables[request])
        self.lengths[new_request] = self.lengths[request]
        for block in self.tables[new_request]:
            self.refcounts[block] += 1

    def append(self, request) -> int:
        length = self.lengths.get(request, 0)
        table = list(self.tables.get(request, []))
        if length == len(table) * self.block_size:
            table.append(self._fresh_block(request))
        elif self.refcounts[table[-1]] > 1:  # shared and partly filled: copy-on-write
            src = table[-1]
            table[-1] = self._fresh_block(request)
            self.refcounts[src] -= 1
            self.copies.append((src, table[-1]))
        self.tables[request] = table
        self.lengths[request] = length + 1
        return table[-1] * self.block_size + length % self.block_size

    def free(self, request) -> None:
        for block in reversed(self.tables.pop(request)):
            self.refcounts[block] -= 1
            if self.refcounts[block] == 0:
                self.free_list.append(block)
        del self.lengths[request]


def _conserved(m, num_blocks: int) -> None:
    held = [b for table in m.tables.values() for b in table]
    assert len(set(m.free_list)) == len(m.free_list), "a block is twice in the free list"
    assert not set(m.free_list) & set(held), "a block is free and in a table"
    assert set(m.free_list) | set(held) == set(range(num_blocks)), "a block is lost"
    for block in range(num_blocks):
        assert m.refcounts[block] == held.count(block), f"block {block}: count != tables holding it"


def cow_assertions(manager_cls) -> None:
    num_blocks, bs = 8, 4
    m = manager_cls(num_blocks, bs)
    parent_slots = [m.append("p") for _ in range(6)]
    free_before = sorted(m.free_list)
    m.fork("p", "c")
    # (1) shared before the first write: same blocks, counted twice, nothing allocated or copied
    assert m.tables["c"] == m.tables["p"] and all(m.refcounts[b] == 2 for b in m.tables["p"])
    assert sorted(m.free_list) == free_before and not m.copies
    _conserved(m, num_blocks)
    # (2) isolated after: the child's write into the shared partial block goes to a private copy
    child_slot = m.append("c")
    p_last, c_last = m.tables["p"][-1], m.tables["c"][-1]
    assert c_last != p_last and m.copies == [(p_last, c_last)]
    assert child_slot // bs == c_last and child_slot not in parent_slots
    assert m.tables["c"][0] == m.tables["p"][0] and m.refcounts[m.tables["p"][0]] == 2
    assert m.refcounts[p_last] == 1 and m.refcounts[c_last] == 1
    parent_slot = m.append("p")
    assert parent_slot // bs == p_last and parent_slot != child_slot and len(m.copies) == 1
    # (3) conserved: counts equal the tables holding each block, and everything comes back
    _conserved(m, num_blocks)
    m.free("p")
    _conserved(m, num_blocks)
    m.free("c")
    _conserved(m, num_blocks)
    assert sorted(m.free_list) == list(range(num_blocks)) and not any(m.refcounts)
