"""Chapter 2 exercises: why contiguous reservation wastes memory.

Replace each `raise NotImplementedError(...)` with your answer, then run `make check-exercises`.
"""


def pow2_reservation(total_len: int, max_len: int) -> int:
    """Exercise 2.1: slots Orca's Pow2 policy reserves for a request storing total_len tokens."""
    raise NotImplementedError("Exercise 2.1: return the slots the Pow2 policy reserves "
                              "(edit exercises/ch02_fragmentation.py, pow2_reservation)")


def single_request_token_share(prompt_len: int, output_len: int, reserved: int) -> float:
    """Exercise 2.2: average fraction of `reserved` slots holding token states over the request's
    output_len + 1 steps (it stores prompt_len tokens in its first step, then one more per step)."""
    raise NotImplementedError("Exercise 2.2: return the time-averaged share of the reservation that "
                              "holds tokens (edit exercises/ch02_fragmentation.py, "
                              "single_request_token_share)")


def first_fit(holes: list[tuple[int, int]], size: int) -> int | None:
    """Exercise 2.3: holes are (start, size) sorted by address; return the start first fit picks
    for a request of `size` slots, or None if no hole is large enough."""
    raise NotImplementedError("Exercise 2.3: return where first fit places the request "
                              "(edit exercises/ch02_fragmentation.py, first_fit)")


from minipaged.fragmentation import FirstFitAllocator  # noqa: E402


class BestFitAllocator(FirstFitAllocator):
    """Exercise 2.4: chapter 2's heap, except that `allocate` takes the smallest free hole that
    is large enough (the lowest address among holes of that size). `free`, `holes` and
    `largest_hole` are inherited: keep `_starts`, `_sizes`, `_regions` and `free_tokens` the
    way they expect (`self._take(i, size)` carves a region from hole `i` and keeps them)."""

    def allocate(self, size: int) -> int | None:
        raise NotImplementedError("Exercise 2.4: hand out the region from the best-fitting hole "
                                  "(edit exercises/ch02_fragmentation.py, "
                                  "BestFitAllocator.allocate)")
