"""Chapter 12 exercises: reference solutions."""

import torch

from minipaged.engine.sampler import Sampler


def apply_repetition_penalty(logits: torch.Tensor, histories: list[list[int]],
                             penalty: float) -> torch.Tensor:
    """Exercise 12.1: penalise, row by row, every token id that occurs in the row's history.

    A seen token's logit is divided by ``penalty`` if positive, multiplied if negative (the
    rule of transformers and vLLM); each distinct token counts once. Returns a new tensor.
    """
    out = logits.clone()
    for row, history in enumerate(histories):
        if not history:
            continue
        ids = torch.tensor(sorted(set(history)), dtype=torch.long, device=logits.device)
        seen = out[row, ids]
        out[row, ids] = torch.where(seen > 0, seen / penalty, seen * penalty)
    return out


class PenalizedSampler(Sampler):
    """Exercise 12.1: chapter 11's sampling part, with a repetition penalty applied before
    every draw."""

    def __init__(self, device, repetition_penalty: float = 1.0) -> None:
        super().__init__(device)
        self.repetition_penalty = repetition_penalty

    def __call__(self, logits: torch.Tensor, seqs) -> torch.Tensor:
        if seqs and self.repetition_penalty != 1.0:
            histories = [s.prompt_token_ids + s.output_token_ids for s in seqs]
            logits = apply_repetition_penalty(logits, histories, self.repetition_penalty)
        return super().__call__(logits, seqs)
