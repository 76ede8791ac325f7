# GENERATED from chapters/11_model_runner.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/11_model_runner.md § Sampling
"""Sampling: one token per row of logits, each row under its own ``SamplingParams``."""

from __future__ import annotations

import torch

from minipaged.engine.scheduler import SamplingParams, Sequence

__all__ = ["make_generator", "sample", "Sampler", "top_logprobs"]


def make_generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    """A private random stream for one sequence (``None``: share the global one)."""
    if seed is None:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


# %% chapters/11_model_runner.md § Sampling
def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None] | None = None) -> torch.Tensor:
    """Pick one token per row of ``logits [B, V]`` under each row's ``SamplingParams``.

    Greedy rows take the argmax. Other rows divide by their temperature, keep their
    top-k and their top-p nucleus, and draw with the exponential race: ``argmax(p / E)``
    with ``E ~ Exp(1)`` is a draw from ``p``, and each seeded row draws its ``E`` from
    its own generator, so its tokens do not depend on what else is in the batch. One
    sort serves top-k and top-p for the whole batch.
    """
    rows, vocab = logits.shape
    if len(params) != rows:
        raise ValueError(f"{rows} rows of logits but {len(params)} SamplingParams")
    greedy_tokens = logits.argmax(dim=-1)
    if all(p.greedy for p in params):
        return greedy_tokens
    device = logits.device
    temperature = torch.tensor([p.temperature if not p.greedy else 1.0 for p in params],
                               device=device, dtype=torch.float32)
    scaled = logits.float() / temperature[:, None]
    top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    top_p = [p.top_p for p in params]
    if min(top_k) < vocab or min(top_p) < 1.0:
        ordered, order = scaled.sort(dim=-1, descending=True)
        ranks = torch.arange(vocab, device=device)[None, :]
        drop = ranks >= torch.tensor(top_k, device=device)[:, None]
        ordered = ordered.masked_fill(drop, float("-inf"))
        probs = ordered.softmax(dim=-1)
        # keep a token while the mass ranked before it is below top_p
        mass_before = probs.cumsum(dim=-1) - probs
        drop |= mass_before >= torch.tensor(top_p, device=device)[:, None]
        drop[:, 0] = False
        scaled = scaled.scatter(1, order, ordered.masked_fill(drop, float("-inf")))
    probs = scaled.softmax(dim=-1)
    race = torch.empty_like(probs).exponential_()
    for row, generator in enumerate(generators or ()):
        if generator is not None:
            race[row].exponential_(generator=generator)
    drawn = (probs / race).argmax(dim=-1)
    is_greedy = torch.tensor([p.greedy for p in params], device=device)
    return torch.where(is_greedy, greedy_tokens, drawn)


# %% chapters/11_model_runner.md § Sampling
class Sampler:
    """The engine's sampling part: one token per row, and a private random stream per
    sequence of a seeded request (seed ``seed + sample_index``), so that its tokens
    depend on its seed alone."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.generators: dict[int, torch.Generator | None] = {}

    def add(self, seq: Sequence) -> None:
        """Give a new sequence its random stream."""
        seed = seq.params.seed
        self.generators[seq.seq_id] = make_generator(
            None if seed is None else seed + seq.sample_index, self.device)

    def drop(self, seq_id: int) -> None:
        """Forget a finished sequence's stream."""
        self.generators.pop(seq_id, None)

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """Row ``i`` of ``logits`` sampled for ``seqs[i]``; the tokens stay on the logits'
        device."""
        return sample(logits, [s.params for s in seqs],
                      [self.generators.get(s.seq_id) for s in seqs])


def top_logprobs(logits: torch.Tensor, tokens: torch.Tensor,
                 ks: list[int | None]) -> list[tuple[float, dict[int, float]] | None]:
    """Per row of ``logits [B, V]``: ``None`` where ``ks[row]`` is None, else the
    log-probability of ``tokens[row]`` and a dict ``{token_id: log-probability}`` of
    it and the ``ks[row]`` most likely tokens. Log-probabilities of the raw logits, in
    fp32 (no temperature, no top-k or top-p), read back to the host in one copy."""
    rows = [row for row, k in enumerate(ks) if k is not None]
    result: list = [None] * len(ks)
    if not rows:
        return result
    index = torch.tensor(rows, device=logits.device)
    logprobs = logits[index].float().log_softmax(-1)
    chosen = tokens.to(logits.device)[index].long()
    sampled = logprobs.gather(1, chosen[:, None])[:, 0]
    values, ids = logprobs.topk(max(ks[row] for row in rows), dim=-1)
    host = torch.cat([chosen[:, None].float(), sampled[:, None], ids.float(), values],
                     dim=1).tolist()  # token ids < 2**24 are exact in fp32
    width = ids.shape[1]
    for i, row in enumerate(rows):
        token, value, top = int(host[i][0]), host[i][1], host[i][2:]
        k = ks[row]
        entry = {token: value}
        entry.update((int(t), v) for t, v in zip(top[:k], top[width:width + k]))
        result[row] = (value, entry)
    return result
