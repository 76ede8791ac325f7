"""Chapter 11 exercises: reference solutions."""

import torch

from minipaged.engine.sampler import Sampler


def nucleus(probs: list[float], top_p: float) -> set[int]:
    """Exercise 11.1: keep a token while the mass ranked before it is below top_p."""
    kept, mass = set(), 0.0
    for token in sorted(range(len(probs)), key=lambda t: -probs[t]):
        if kept and mass >= top_p:
            break
        kept.add(token)
        mass += probs[token]
    return kept


def decode_roofline_tokens_per_s(weight_bytes: float, kv_bytes_per_token: float, batch: int,
                                 mean_context: float, bandwidth: float) -> float:
    """Exercise 11.2: batch tokens per (weights + KV) / bandwidth seconds."""
    step = (weight_bytes + batch * mean_context * kv_bytes_per_token) / bandwidth
    return batch / step


def ttft_and_tpot(arrival: float, token_times: list[float]) -> tuple[float, float | None]:
    """Exercise 11.3: first-token latency and the mean gap after it."""
    ttft = token_times[0] - arrival
    if len(token_times) < 2:
        return ttft, None
    return ttft, (token_times[-1] - token_times[0]) / (len(token_times) - 1)


def apply_repetition_penalty(logits: torch.Tensor, histories: list[list[int]],
                             penalty: float) -> torch.Tensor:
    """Exercise 11.4: penalise, row by row, every token id that occurs in the row's history.

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
    """Exercise 11.4: chapter 11's sampling part, with a repetition penalty applied before
    every draw."""

    def __init__(self, device, repetition_penalty: float = 1.0) -> None:
        super().__init__(device)
        self.repetition_penalty = repetition_penalty

    def __call__(self, logits: torch.Tensor, seqs) -> torch.Tensor:
        if seqs and self.repetition_penalty != 1.0:
            histories = [s.prompt_token_ids + s.output_token_ids for s in seqs]
            logits = apply_repetition_penalty(logits, histories, self.repetition_penalty)
        return super().__call__(logits, seqs)
