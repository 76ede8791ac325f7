"""Chapter 2 reference solutions."""


def pow2_reservation(total_len: int, max_len: int) -> int:
    return min(max_len, 1 << (total_len - 1).bit_length())


def single_request_token_share(prompt_len: int, output_len: int, reserved: int) -> float:
    return (prompt_len + output_len / 2) / reserved


def first_fit(holes: list[tuple[int, int]], size: int) -> int | None:
    return next((start for start, hole in holes if hole >= size), None)


from minipaged.fragmentation import FirstFitAllocator  # noqa: E402


class BestFitAllocator(FirstFitAllocator):
    def allocate(self, size: int) -> int | None:
        if size <= 0:
            raise ValueError(f"size must be positive, got {size}")
        fits = [i for i, hole in enumerate(self._sizes) if hole >= size]
        if not fits:
            return None
        i = min(fits, key=lambda k: (self._sizes[k], self._starts[k]))
        return self._take(i, size)
