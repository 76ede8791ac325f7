"""Chapter 13 exercises: reference solutions."""

import torch

FP8_MAX = 448.0


def round_to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Exercise 13.1: spacing 2**(e - 3) in [2**e, 2**(e+1)), 2**-9 below 2**-6."""
    x = x.float().clamp(-FP8_MAX, FP8_MAX)
    _, exponent = torch.frexp(x)                   # |x| in [2**(exponent-1), 2**exponent)
    spacing = torch.ldexp(torch.ones_like(x), (exponent - 1 - 3).clamp(min=-9))
    return torch.round(x / spacing) * spacing      # torch.round: half to even


def append_row(codes: torch.Tensor, scale: float, num_filled: int,
               row: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Exercise 13.2: the first row sets the scale; later ones only grow it, re-quantizing
    the stored rows."""
    codes = codes.clone()
    amax = float(row.abs().max())
    if amax > 0 and (num_filled == 0 or amax > FP8_MAX * scale):
        new_scale = amax / FP8_MAX
        old = codes[:num_filled].float() * scale
        codes[:num_filled] = (old / new_scale).clamp(-FP8_MAX, FP8_MAX).to(codes.dtype)
        scale = new_scale
    codes[num_filled] = (row.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(codes.dtype)
    return codes, scale
