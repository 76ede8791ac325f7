"""Checks for the chapter 5 exercises (exercises/ch05_sharing.py)."""

import pytest

from minipaged.memory.block_manager import TeachingBlockManager
from tests.exercises.answers import load

ex = load("ch05_sharing")


# A correct manager and planted bugs, to check the learner's assertions (exercise 5.2) against.
class Reference(TeachingBlockManager):
    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size)
        self.refcounts = [0] * num_blocks
        self.copies = []

    def fork(self, request, new_request):
        self.tables[new_request] = list(self.tables[request])
        self.lengths[new_request] = self.lengths[request]
        for b in self.tables[new_request]:
            self.refcounts[b] += 1

    def _take(self):
        b = self.free_list.pop()
        self.refcounts[b] = 1
        return b

    def append(self, request):
        n = self.lengths.get(request, 0)
        table = self.tables.setdefault(request, [])
        if n == len(table) * self.block_size:
            table.append(self._take())
        elif self.refcounts[table[-1]] > 1:
            src = table[-1]
            table[-1] = self._take()
            self.refcounts[src] -= 1
            self.copies.append((src, table[-1]))
        self.lengths[request] = n + 1
        return table[-1] * self.block_size + n % self.block_size

    def free(self, request):
        for b in reversed(self.tables.pop(request)):
            self.refcounts[b] -= 1
            if self.refcounts[b] == 0:
                self.free_list.append(b)
        del self.lengths[request]


class WritesInPlace(Reference):
    """Bug: no copy-on-write; the child writes into the shared block."""

    def append(self, request):
        n = self.lengths.get(request, 0)
        table = self.tables.setdefault(request, [])
        if n == len(table) * self.block_size:
            table.append(self._take())
        self.lengths[request] = n + 1
        return table[-1] * self.block_size + n % self.block_size


class CopiesEverything(Reference):
    """Bug: fork copies all blocks eagerly; nothing is shared."""

    def fork(self, request, new_request):
        self.tables[new_request] = [self._take() for _ in self.tables[request]]
        self.lengths[new_request] = self.lengths[request]


class ForgetsToCount(Reference):
    """Bug: fork shares the table but does not count the new references."""

    def fork(self, request, new_request):
        self.tables[new_request] = list(self.tables[request])
        self.lengths[new_request] = self.lengths[request]


class LeaksOnFree(Reference):
    """Bug: shared blocks are never returned (the count is decremented, the block not pushed)."""

    def free(self, request):
        for b in reversed(self.tables.pop(request)):
            self.refcounts[b] -= 1
            if self.refcounts[b] == 0 and b % 2:
                self.free_list.append(b)       # odd blocks come back, even ones leak
        del self.lengths[request]


class ForgetsCopyInstruction(Reference):
    """Bug: copy-on-write takes a fresh block but never tells the cache to copy."""

    def append(self, request):
        before = len(self.copies)
        slot = super().append(request)
        del self.copies[before:]
        return slot


def test_5_1_fork_and_copy_on_write():
    m = ex.SharingTeachingManager(6, 2)
    slots = [m.append("a") for _ in range(3)]
    m.fork("a", "b")
    assert m.tables["a"] == m.tables["b"] and [m.refcounts[x] for x in m.tables["a"]] == [2, 2]
    s = m.append("b")                                    # position 3: into the shared partial block
    src, dst = m.copies[-1]
    assert src == m.tables["a"][1] and dst == m.tables["b"][1] and s == dst * 2 + 1
    assert s not in slots and m.refcounts[src] == 1 and m.refcounts[dst] == 1
    assert m.append("a") == src * 2 + 1                  # the parent now writes in place
    assert len(m.copies) == 1
    m.append("a")                                        # position 4: a fresh block, no copy
    assert len(m.copies) == 1 and len(m.tables["a"]) == 3
    m.fork("b", "c")
    m.free("b")
    assert m.refcounts[m.tables["c"][0]] == 2            # still held by a and c
    m.free("a")
    m.free("c")
    assert sorted(m.free_list) == list(range(6)) and not any(m.refcounts)


def test_5_1_full_blocks_stay_shared():
    m = ex.SharingTeachingManager(8, 2)
    for _ in range(4):
        m.append("a")
    m.fork("a", "b")
    m.append("b")
    m.append("a")
    assert not m.copies and m.tables["a"][:2] == m.tables["b"][:2]


def test_5_2_assertions_pass_on_a_correct_manager():
    ex.cow_assertions(Reference)


@pytest.mark.parametrize("buggy", [WritesInPlace, CopiesEverything, ForgetsToCount, LeaksOnFree,
                                   ForgetsCopyInstruction])
def test_5_2_assertions_catch_bugs(buggy):
    with pytest.raises(AssertionError):
        ex.cow_assertions(buggy)
