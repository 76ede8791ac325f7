# GENERATED from chapters/14_fast_engine.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/14_fast_engine.md § Sampling in one kernel
"""Chapter 11's sampling part with one kernel for most rows: ``FusedSampler``.

Rows that need neither top-k nor top-p are sampled by ``sample_fused``
(``minipaged.kernels.fused_ops``) with a Philox key per row, made of the request's seed
and position when it has a seed; the others go through chapter 11's ``sample``.
"""

from __future__ import annotations

import torch

from minipaged.engine.sampler import Sampler
from minipaged.engine.scheduler import Sequence
from minipaged.kernels.fused_ops import sample_fused

__all__ = ["POSITION_BITS", "fused_sampling_applies", "sampling_inputs", "to_device",
           "FusedSampler"]

POSITION_BITS = 20  # a key's low bits: the tokens a sequence has generated so far


def fused_sampling_applies(params: list, vocab: int) -> bool:
    """Whether ``sample_fused`` can serve these rows: no top-k, no top-p."""
    return all(p.greedy or ((p.top_k <= 0 or p.top_k >= vocab) and p.top_p >= 1.0)
               for p in params)


def sampling_inputs(seqs: list, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: 1 / temperature (0 when greedy) and the Philox key, on ``device``."""
    keys = torch.randint(0, 2**62, (len(seqs),), dtype=torch.int64).tolist()
    inv_temperature = []
    for row, seq in enumerate(seqs):  # Python lists: a tensor per element costs more
        p = seq.params
        inv_temperature.append(0.0 if p.greedy else 1.0 / p.temperature)
        if p.seed is not None:
            seed = (p.seed + seq.sample_index) % 2 ** (62 - POSITION_BITS)
            position = len(seq.output_token_ids) % 2**POSITION_BITS
            keys[row] = (seed << POSITION_BITS) | position
    return (to_device(torch.tensor(inv_temperature, dtype=torch.float32), device),
            to_device(torch.tensor(keys, dtype=torch.int64), device))


def to_device(host: torch.Tensor, device) -> torch.Tensor:
    """``host`` on ``device``, queued behind the GPU's work instead of waiting for it:
    a GPU copies from pinned (page-locked) memory without stopping the host."""
    if torch.device(device).type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


# %% chapters/14_fast_engine.md § The fast engine
class FusedSampler(Sampler):
    """Chapter 11's sampling part with one kernel for the rows that need neither top-k
    nor top-p; those that do go through chapter 11's ``sample``. Each row is routed on
    its own, so a seeded row draws the same tokens whatever shares its batch."""

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        vocab, device = logits.shape[1], logits.device
        if all(s.params.greedy for s in seqs):
            return super().__call__(logits, seqs)
        fused = [fused_sampling_applies([s.params], vocab) for s in seqs]
        if all(fused):
            return sample_fused(logits, *sampling_inputs(seqs, device))
        if not any(fused):
            return super().__call__(logits, seqs)
        fast = [row for row, f in enumerate(fused) if f]
        slow = [row for row, f in enumerate(fused) if not f]
        fast_rows, slow_rows = (to_device(torch.tensor(r), device) for r in (fast, slow))
        tokens = torch.empty(len(seqs), dtype=torch.int32, device=device)
        tokens[fast_rows] = sample_fused(logits[fast_rows], *sampling_inputs(
            [seqs[row] for row in fast], device))
        tokens[slow_rows] = super().__call__(logits[slow_rows],
                                             [seqs[row] for row in slow]).to(torch.int32)
        return tokens
