"""Chapter 2 reference solutions."""


def pow2_predictions() -> dict[int, int]:
    # the smallest power of two >= the length, capped at L_max: 512 holds 512 exactly
    return {500: 512, 512: 512, 513: 1024, 1025: 2048, 2000: 2048}


def single_request_token_share(prompt_len: int, output_len: int, reserved: int) -> float:
    return (prompt_len + output_len / 2) / reserved


def first_fit_predictions() -> dict:
    # after the frees the holes are (0, 8) and (16, 16); 4 -> 0 (hole (4, 4) left), 10 -> 16
    # (hole (26, 6) left), 5 -> 26 (the hole (4, 4) is too small; (31, 1) left), and the last 5
    # fails although 5 slots are free: the largest hole holds 4
    return {"starts": [0, 16, 26, None], "holes": [(4, 4), (31, 1)]}


from minipaged.book.fragmentation import FirstFitAllocator  # noqa: E402


class BestFitAllocator(FirstFitAllocator):
    def allocate(self, size: int) -> int | None:
        if size <= 0:
            raise ValueError(f"size must be positive, got {size}")
        fits = [i for i, hole in enumerate(self._sizes) if hole >= size]
        if not fits:
            return None
        i = min(fits, key=lambda k: (self._sizes[k], self._starts[k]))
        return self._take(i, size)
