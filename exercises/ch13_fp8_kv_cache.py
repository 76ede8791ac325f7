"""Chapter 13 exercises: a quantized KV cache.

Replace each `raise NotImplementedError(...)` with your answer, then run `make check-exercises`.
"""

import torch


def round_to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Exercise 13.1: fp32 ``x`` rounded to the nearest e4m3 value (ties to even, saturating
    at +-448, subnormals included), as fp32, without torch's float8 dtypes."""
    raise NotImplementedError("Exercise 13.1: round each value onto the e4m3 grid by hand "
                              "(edit exercises/ch13_fp8_kv_cache.py, round_to_e4m3)")


def append_row(codes: torch.Tensor, scale: float, num_filled: int,
               row: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Exercise 13.2: store fp32 ``row [D]`` as row ``num_filled`` of one head's block.

    ``codes`` is the block's ``[block_size, D]`` float8_e4m3fn tensor, ``scale`` its one scale
    (rows ``0..num_filled-1`` decode to ``codes[i].float() * scale``). Return the new
    ``(codes, scale)``: nothing saturated, the stored rows still decoding to about what they
    held, and the scale no larger than the block needs. An empty block (``num_filled == 0``)
    takes its scale from the row. Do not modify ``codes`` in place.
    """
    raise NotImplementedError("Exercise 13.2: append a row to a block that has one scale "
                              "(edit exercises/ch13_fp8_kv_cache.py, append_row)")
