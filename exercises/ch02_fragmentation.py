"""Chapter 2 exercises: why contiguous reservation wastes memory.

Replace each `raise NotImplementedError(...)` with your answer, then run `make check-exercises`.
"""


def pow2_predictions() -> dict[int, int]:
    """Exercise 2.1: predict the slots Orca's Pow2 policy reserves (L_max = 2048) for requests
    that will store 500, 512, 513, 1025 and 2000 tokens: ``{total_len: reserved_slots}``."""
    raise NotImplementedError("Exercise 2.1: write down the reservations you predict "
                              "(edit exercises/ch02_fragmentation.py, pow2_predictions)")


def single_request_token_share(prompt_len: int, output_len: int, reserved: int) -> float:
    """Exercise 2.2: average fraction of `reserved` slots holding token states over the request's
    output_len + 1 steps (it stores prompt_len tokens in its first step, then one more per step)."""
    raise NotImplementedError("Exercise 2.2: return the time-averaged share of the reservation that "
                              "holds tokens (edit exercises/ch02_fragmentation.py, "
                              "single_request_token_share)")


def first_fit_predictions() -> dict:
    """Exercise 2.3: predict a first-fit heap of 32 slots. After ``a = allocate(8)``,
    ``b = allocate(8)``, ``c = allocate(8)``, ``free(a)``, ``free(c)``, four more requests come:
    ``allocate(4)``, ``allocate(10)``, ``allocate(5)``, ``allocate(5)``. Return
    ``{"starts": [the four starts, None where a request fails], "holes": [(start, size), ...]}``,
    the free holes at the end, sorted by address."""
    raise NotImplementedError("Exercise 2.3: write down where first fit puts each request "
                              "(edit exercises/ch02_fragmentation.py, first_fit_predictions)")


from minipaged.book.fragmentation import FirstFitAllocator  # noqa: E402


class BestFitAllocator(FirstFitAllocator):
    """Exercise 2.4: chapter 2's heap, except that `allocate` takes the smallest free hole that
    is large enough (the lowest address among holes of that size). `free`, `holes` and
    `largest_hole` are inherited: keep `_starts`, `_sizes`, `_regions` and `free_tokens` the
    way they expect (`self._take(i, size)` carves a region from hole `i` and keeps them)."""

    def allocate(self, size: int) -> int | None:
        raise NotImplementedError("Exercise 2.4: hand out the region from the best-fitting hole "
                                  "(edit exercises/ch02_fragmentation.py, "
                                  "BestFitAllocator.allocate)")
