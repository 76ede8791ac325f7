# GENERATED from chapters/11_model_runner.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/11_model_runner.md § The model runner
"""The model runner: the one place that turns a scheduled step into tensors."""

from __future__ import annotations

import gc
import itertools

import torch

from minipaged.memory.block_table import blocks_needed
from minipaged.model.qwen3 import ForwardBatch
from minipaged.engine.sampler import top_logprobs
from minipaged.engine.scheduler import SchedulerOutput

__all__ = ["ModelRunner", "DecodeGraphs"]


class ModelRunner:
    """Runs scheduled steps on the model: the block moves a step needs (swaps,
    copy-on-write copies), the forward batches built from the reservation, decode
    replayed as CUDA graphs, and sampling through the engine's ``sampler``.

    ``single_forward(model, cache)`` says whether one forward may take a step's
    prefills and decodes together (chapter 15's model can); else they run apart.
    """

    def __init__(self, model, cache, cpu_cache, sampler, stats, *, max_num_seqs: int,
                 max_model_len: int, enable_cuda_graphs: bool,
                 single_forward=lambda model, cache: False) -> None:
        self.model, self.cache, self.cpu_cache = model, cache, cpu_cache
        self.sampler, self.stats = sampler, stats
        self.max_num_seqs, self.max_model_len = max_num_seqs, max_model_len
        self.enable_cuda_graphs = enable_cuda_graphs
        self.single_forward = single_forward
        self.graphs: DecodeGraphs | None = None  # captured on the first decode step

    def execute(self, out: SchedulerOutput, read, children_for=None):
        """Run a scheduled step (block moves, forward); return ``read(logits, rows)``."""
        self.move_blocks(out)
        logits, rows = self.forward(out, children_for)
        return read(logits, rows)

    def move_blocks(self, out: SchedulerOutput) -> None:
        if out.swap_out:
            self.cache.swap_out(self.cpu_cache, out.swap_out)
        if out.swap_in:
            self.cache.swap_in(self.cpu_cache, out.swap_in)
        if out.reservation.copies:
            self.cache.copy_blocks(out.reservation.copies)

    # %% chapters/11_model_runner.md § Two batches per step
    def forward(self, out: SchedulerOutput, children_for=None):
        """Run the step's chunks: decodes in one batch, prefills in another.

        Returns logits [rows, vocab] to sample from and, per row, ``(sequence, fork_child)``
        (the child is None except for the siblings of an ``n > 1`` request, which
        ``children_for(seq)`` creates at its first sample).
        """
        res, chunks = out.reservation, out.chunks
        parts, pick, rows = [], [], []
        for group in self.groups(chunks):
            subset = None if len(group) == len(chunks) else group
            row = sum(len(p) for p in parts)  # this group's first row in the step's logits
            parts.append(self.run_group([chunks[i] for i in group], res, subset))
            for i in group:
                if not chunks[i].samples:
                    continue
                seq = chunks[i].seq
                pick.append(row)
                rows.append((seq, None))
                if seq.params.n > 1 and children_for is not None:
                    for child in children_for(seq):
                        pick.append(row)
                        rows.append((seq, child))
                row += 1
        logits = parts[0] if len(parts) == 1 else torch.cat(parts)
        if len(pick) != len(logits) or pick != list(range(len(pick))):
            logits = logits[torch.tensor(pick, device=logits.device)]
        return logits, rows

    # %% chapters/11_model_runner.md § Two batches per step
    def groups(self, chunks) -> list[list[int]]:
        """The step's chunks (indices) in forward groups: one-token decodes, then prefills;
        all in one group when the model takes them together."""
        decode = [i for i, c in enumerate(chunks) if c.num_tokens == 1]
        prefill = [i for i, c in enumerate(chunks) if c.num_tokens > 1]
        if decode and prefill and self.single_forward(self.model, self.cache):
            return [list(range(len(chunks)))]
        return [group for group in (decode, prefill) if group]

    # %% chapters/11_model_runner.md § Two batches per step
    def run_group(self, chunks, res, rows) -> torch.Tensor:
        """One forward over ``chunks``, the step's sequences ``rows`` (None: all)."""
        ids = torch.tensor([t for c in chunks
                            for t in c.seq.token_ids(c.start, c.start + c.num_tokens)],
                           dtype=torch.long)
        ends = itertools.accumulate(c.num_tokens for c in chunks)
        logits_indices = torch.tensor([e - 1 for c, e in zip(chunks, ends) if c.samples],
                                      dtype=torch.long)
        return self.run_batch(ForwardBatch.from_reservation(res, ids, rows, logits_indices))

    def decode(self, out: SchedulerOutput, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits of a decode step whose input tokens are already on the device (chapter
        15 feeds a step the tokens the previous one sampled, before the host reads them)."""
        batch = ForwardBatch.from_reservation(out.reservation, input_ids, None,
                                              torch.arange(len(out.chunks)))
        if input_ids.is_cuda:  # pinned: the copies to the GPU do not wait for it
            for name in ("positions", "slot_mapping", "block_tables", "seq_lens"):
                setattr(batch, name, getattr(batch, name).pin_memory())
        return self.run_batch(batch)

    def run_batch(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits of one batch: a decode batch replayed as a CUDA graph when one fits."""
        if batch.is_decode:
            self.stats.kv_tokens_read += int(batch.seq_lens.sum())
            graphs = self.decode_graphs() if self.enable_cuda_graphs else None
            if graphs is not None and graphs.fits(batch):
                self.stats.graph_steps += 1
                return graphs.run(batch)
        return self.model(batch.to(self.model.device), self.cache)

    # %% chapters/11_model_runner.md § Two batches per step
    def sample(self, logits: torch.Tensor, rows) -> list:
        """One token per row: ``[((sequence, fork_child), token, logprobs), ...]``, where
        ``logprobs`` is ``top_logprobs``'s entry for a request that asks for them
        (``SamplingParams.logprobs``), else None."""
        if not rows:
            return []
        seqs = [child or seq for seq, child in rows]
        tokens = self.sampler(logits, seqs)
        ks = [s.params.logprobs for s in seqs]
        logprobs = (top_logprobs(logits, tokens, ks) if any(k is not None for k in ks)
                    else ks)
        return list(zip(rows, tokens.tolist(), logprobs))

    # %% chapters/11_model_runner.md § CUDA graphs for decode
    def decode_graphs(self) -> DecodeGraphs | None:
        """The captured decode graphs (captured on first use), or None when they are off."""
        if self.graphs is None and self.enable_cuda_graphs:
            max_blocks = blocks_needed(self.max_model_len, self.cache.block_size)
            self.graphs = DecodeGraphs(self.model, self.cache, self.max_num_seqs, max_blocks)
        return self.graphs


# %% chapters/11_model_runner.md § CUDA graphs for decode
class DecodeGraphs:
    """The decode forward captured as CUDA graphs, one per batch-size bucket, replayed.

    A decode step of a small model is well over a thousand short kernels; launching them
    one by one from Python takes longer than running them. Capture records the launches
    once into a graph per bucket (1, 2, 4, ... up to ``max_batch``) over static input
    buffers; a step copies its inputs into the buffers, pads the batch to the next
    bucket (padding rows write to slot -1, i.e. nowhere, and have length 0) and replays.
    Block tables are ``max_blocks`` wide, so the same graph serves every context length.
    """

    def __init__(self, model, cache, max_batch: int,
                 max_blocks: int) -> None:
        device = model.device
        self.model, self.cache, self.max_blocks = model, cache, max_blocks
        self.buckets = [b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
                        if b < max_batch]
        self.buckets.append(max_batch)
        n = max_batch
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.long, device=device)
        self.block_tables = torch.zeros((n, max_blocks), dtype=torch.int32,
                                        device=device)
        self.seq_lens = torch.zeros(n, dtype=torch.int32, device=device)
        self.rows = torch.arange(n, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        pool = None
        gc.collect()  # earlier engines' garbage goes now, not in the middle of a capture
        for b in reversed(self.buckets):  # largest first: smaller graphs reuse its pool
            batch = self._batch(b)
            model(batch, cache)  # compile and warm up outside the capture
            torch.cuda.synchronize(device)
            graph = torch.cuda.CUDAGraph()
            gc.disable()  # no collection frees an earlier engine's tensors mid-capture
            try:
                with torch.cuda.graph(graph, pool=pool):
                    self.outputs[b] = model(batch, cache)
            finally:
                gc.enable()
            pool = graph.pool()
            self.graphs[b] = graph

    # %% chapters/11_model_runner.md § CUDA graphs for decode
    def _batch(self, b: int) -> ForwardBatch:
        return ForwardBatch(
            input_ids=self.input_ids[:b], positions=self.positions[:b],
            slot_mapping=self.slot_mapping[:b], query_lens=(1,) * b, context_lens=(1,) * b,
            block_tables=self.block_tables[:b], seq_lens=self.seq_lens[:b],
            logits_indices=self.rows[:b])

    def fits(self, batch: ForwardBatch) -> bool:
        """Whether a decode ``batch`` has a graph: few enough rows, tables narrow enough."""
        return (len(batch.query_lens) <= self.buckets[-1]
                and batch.block_tables.shape[1] <= self.max_blocks)

    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits of one decode ``batch`` (host tensors, copied into the buffers), one row
        per ``batch.logits_indices``."""
        n = len(batch.input_ids)
        b = next(b for b in self.buckets if b >= n)
        self.input_ids[:n].copy_(batch.input_ids, non_blocking=True)
        self.positions[:n].copy_(batch.positions, non_blocking=True)
        self.slot_mapping[:n].copy_(batch.slot_mapping, non_blocking=True)
        self.slot_mapping[n:b].fill_(-1)
        self.seq_lens[:n].copy_(batch.seq_lens, non_blocking=True)
        self.seq_lens[n:b].zero_()
        tables = batch.block_tables
        self.block_tables[:n, :tables.shape[1]].copy_(tables, non_blocking=True)
        self.graphs[b].replay()
        logits = self.outputs[b][:n]
        if len(batch.logits_indices) == n:  # every row samples (the usual decode step)
            return logits
        return logits[batch.logits_indices.to(logits.device)]
