# GENERATED from chapters/11_engine.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/11_engine.md § The exported engine
"""The serving engine: vLLM's offline ``LLM`` API on chapters 4-10's pieces."""

from __future__ import annotations

import itertools
import math
import operator
import time
from dataclasses import dataclass, field, replace

import torch

from minipaged.block_table import blocks_needed
from minipaged.kv_cache import PagedKVCache
from minipaged.prefix_cache import PrefixCachingBlockManager
from minipaged.qwen3 import ForwardBatch, Qwen3PagedModel
from minipaged.runtime import default_device
from minipaged.scheduler import (PromptTooLongError, SamplingParams, Scheduler,
                                 ScheduledChunk, SchedulerConfig, SchedulerOutput,
                                 Sequence, SequenceStatus)
from minipaged.sizing import block_bytes, blocks_in_budget, kv_bytes_per_token

__all__ = [
    "make_generator",
    "sample",
    "CompletionOutput",
    "RequestOutput",
    "BeamSearchOutput",
    "RunStats",
    "DecodeGraphs",
    "EngineError",
    "InvalidRequestError",
    "LLM",
]


class EngineError(RuntimeError):
    """The engine cannot make progress (for example a step that schedules nothing)."""


class InvalidRequestError(ValueError):
    """A request that is wrong in itself (a token id outside the vocabulary, a float
    token, a sampling setting out of range); nothing of it was queued."""


# %% chapters/11_engine.md § Sampling
def make_generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    """A private random stream for one sequence (``None``: share the global one)."""
    if seed is None:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


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


# %% chapters/11_engine.md § What generate returns
@dataclass
class CompletionOutput:
    """One generated continuation of a prompt (``n`` of them per request)."""

    index: int
    token_ids: list[int]
    text: str | None
    finish_reason: str | None


@dataclass
class RequestOutput:
    """What ``LLM.generate`` returns per prompt, in prompt order (vLLM's field names).

    ``error`` is set, and ``outputs`` empty, for a request the engine refused (too long
    a prompt); the other requests of the batch are served normally. ``metrics`` holds
    arrival, first-token and finish times (seconds, ``time.perf_counter``), preemptions
    and prompt tokens found cached.
    """

    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    error: str | None = None
    metrics: dict = field(default_factory=dict)


@dataclass
class RunStats:
    """Counters of one ``generate`` call, and the scheduler's per-step timeline."""

    steps: int = 0
    prefill_tokens: int = 0
    output_tokens: int = 0
    preemptions: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    kv_tokens_read: int = 0
    graph_steps: int = 0
    forward_seconds: float = 0.0
    schedule_seconds: float = 0.0
    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)

    # %% chapters/11_engine.md § Metrics
    def summary(self) -> dict:
        def mean(xs):
            return sum(xs) / len(xs) if xs else None

        return {"steps": self.steps, "prefill_tokens": self.prefill_tokens,
                "output_tokens": self.output_tokens, "preemptions": self.preemptions,
                "prefix_hit_rate": self.cached_prompt_tokens / max(1, self.prompt_tokens),
                "kv_tokens_read": self.kv_tokens_read, "graph_steps": self.graph_steps,
                "forward_seconds": self.forward_seconds,
                "schedule_seconds": self.schedule_seconds, "mean_ttft_s": mean(self.ttft),
                "mean_tpot_s": mean(self.tpot)}


# %% chapters/11_engine.md § The LLM class
@dataclass
class _Request:
    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence]
    error: str | None = None
    aborted: bool = False

    @property
    def finished(self) -> bool:
        return self.error is not None or (
            (self.aborted or len(self.seqs) == self.params.n)
            and all(s.status.finished for s in self.seqs))


def _prompt_list(prompts) -> list:
    """A list of prompts: one prompt alone (text or token ids) becomes a list of one."""
    one = isinstance(prompts, str) or (prompts and isinstance(prompts[0], int))
    return [prompts] if one else prompts


def _load_model(model, tokenizer, device):
    if isinstance(model, str):
        from minipaged.qwen3 import load_hub_qwen3

        model, tokenizer = load_hub_qwen3(model, device=device or default_device())
    if not isinstance(model, Qwen3PagedModel):
        model = Qwen3PagedModel.from_hf(model)
    if device is not None:
        model = model.to(device)
    return model, tokenizer


def _eos_id(config, tokenizer) -> int | None:
    eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    eos = eos if eos is not None else getattr(config, "eos_token_id", None)
    return eos[0] if isinstance(eos, (list, tuple)) else eos


def _make_manager(num_blocks: int, block_size: int, prefix_caching: bool,
                  num_cpu_blocks: int):
    """Chapter 6's manager: sharing, copy-on-write, a CPU pool, prefix caching."""
    return PrefixCachingBlockManager(num_blocks, block_size, num_cpu_blocks,
                                     enable_prefix_caching=prefix_caching)


# %% chapters/11_engine.md § The LLM class
class LLM:
    """Offline batched generation on a paged KV cache, shaped like vLLM's ``LLM``.

    ``model`` is a transformers ``Qwen3ForCausalLM`` (its weights are shared, not
    copied), a ``Qwen3PagedModel``, or a hub id / local path (needs the network or a
    local copy). ``num_blocks=None`` sizes the cache from free GPU memory
    (``gpu_memory_utilization`` of the card, minus what is already used), or to a small
    default on CPU.
    """

    CPU_DEFAULT_BLOCKS = 1024

    def __init__(self, model, *, block_size: int = 16, num_blocks: int | None = None,
                 max_num_seqs: int = 256, enable_prefix_caching: bool = True,
                 device: torch.device | str | None = None, tokenizer=None,
                 max_model_len: int | None = None, max_num_batched_tokens: int = 8192,
                 gpu_memory_utilization: float = 0.9, policy: str = "decode_first",
                 preemption_mode: str = "recompute", num_cpu_blocks: int | None = None,
                 enable_chunked_prefill: bool = False,
                 enable_cuda_graphs: bool | None = None,
                 check_invariants: bool = False) -> None:
        self.model, self.tokenizer = self._load(model, tokenizer, device)
        config = self.model.config
        self.max_model_len = max_model_len or config.max_position_embeddings
        if num_blocks is None:
            num_blocks = self._auto_num_blocks(block_size, gpu_memory_utilization,
                                               max_num_batched_tokens)
        self.cache = self._new_cache(num_blocks, block_size)
        if preemption_mode == "swap" and num_cpu_blocks is None:
            num_cpu_blocks = num_blocks
        self.cpu_cache = self.cache.cpu_pool(num_cpu_blocks) if num_cpu_blocks else None
        self.manager = _make_manager(num_blocks, block_size, enable_prefix_caching,
                                     num_cpu_blocks or 0)
        self.scheduler = Scheduler(self.manager, SchedulerConfig(
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=self.max_model_len, policy=policy,
            preemption_mode=preemption_mode,
            enable_chunked_prefill=enable_chunked_prefill))
        self.check_invariants = check_invariants
        on_gpu = self.model.device.type == "cuda"
        self.enable_cuda_graphs = (on_gpu if enable_cuda_graphs is None
                                   else enable_cuda_graphs and on_gpu)
        self._graphs = None  # DecodeGraphs, captured on the first decode step
        self.eos_token_id = _eos_id(config, self.tokenizer)
        self.stats = RunStats()
        self._requests: dict[int, _Request] = {}
        self._generators: dict[int, torch.Generator | None] = {}
        self._request_ids = itertools.count()
        self._seq_ids = itertools.count()

    # %% chapters/11_engine.md § The LLM class
    def _auto_num_blocks(self, block_size: int, utilization: float, max_tokens: int) -> int:
        c, device = self.model.config, self.model.device
        if device.type != "cuda":
            return self.CPU_DEFAULT_BLOCKS
        per_block = self._block_bytes(block_size)
        free, total = torch.cuda.mem_get_info(device)
        # memory PyTorch caches but no tensor uses (a previous engine's cache) is free too
        free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        activations = max_tokens * (c.vocab_size * 4 + 16 * c.intermediate_size * 2)
        budget = int(utilization * total) - (total - free) - activations
        if budget < per_block:
            raise EngineError(f"no GPU memory left for the KV cache ({free / 2**30:.1f} "
                              + "GiB free): lower max_num_batched_tokens, raise "
                              + "gpu_memory_utilization, or set num_blocks")
        return blocks_in_budget(budget, per_block)


    def model_parameters(self):
        """The paged model's parameters (shared with the transformers model)."""
        return self.model.parameters()


    def add_request(self, prompt, params: SamplingParams | None = None) -> int:
        """Queue one prompt (token ids, or text with a tokenizer); returns its request id.

        Raises ``InvalidRequestError`` for a malformed request and ``PromptTooLongError``
        for one that can never be served; either way nothing is queued.
        """
        params = params or SamplingParams()
        text, ids = self._tokenize(prompt)
        self._check_request(ids, params)
        self.scheduler.check_prompt(len(ids))
        request_id = next(self._request_ids)
        seq = self._new_sequence(request_id, ids, params, 0)
        self._requests[request_id] = _Request(request_id, text, ids, params, [seq])
        self.scheduler.add(seq)
        self.stats.prompt_tokens += len(ids)
        return request_id


    def has_unfinished_requests(self) -> bool:
        """Whether any added request is still waiting, running or swapped out."""
        return self.scheduler.has_unfinished()

    # %% chapters/11_engine.md § The LLM class
    def _load(self, model, tokenizer, device):
        """The paged model and the tokenizer this engine serves (a subclass may swap in
        a faster model)."""
        return _load_model(model, tokenizer, device)


    def _new_cache(self, num_blocks: int, block_size: int) -> PagedKVCache:
        """An empty paged cache of ``num_blocks`` blocks for the served model (a subclass
        may store its blocks differently)."""
        return self.model.new_cache(num_blocks, block_size)


    def _block_bytes(self, block_size: int) -> int:
        """Bytes one block of ``_new_cache`` takes, all layers, keys and values."""
        c = self.model.config
        per_token = kv_bytes_per_token(c.num_hidden_layers, c.num_key_value_heads,
                                       c.head_dim, self.model.dtype.itemsize)
        return block_bytes(per_token, block_size)

    # %% chapters/11_engine.md § The LLM class
    def _tokenize(self, prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise TypeError("text prompts need a tokenizer: pass token ids, "
                                + "or a model with one")
            return prompt, list(self.tokenizer(prompt)["input_ids"])
        try:
            return None, [operator.index(t) for t in prompt]
        except TypeError:
            raise InvalidRequestError("token ids must be integers, got "
                                      + f"{list(prompt)[:8]}") from None


    def _check_request(self, ids: list[int], params: SamplingParams) -> None:
        """Raise ``InvalidRequestError`` if the request can never be valid."""
        vocab = self.model.config.vocab_size
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError("expected SamplingParams, got "
                                      + type(params).__name__)
        tokens = (*ids, *params.stop_token_ids)
        if tokens and (min(tokens) < 0 or max(tokens) >= vocab):
            bad = [t for t in tokens if not 0 <= t < vocab]
            raise InvalidRequestError(f"token ids {bad[:8]} are outside the vocabulary "
                                      + f"[0, {vocab})")
        if not math.isfinite(params.temperature):
            raise InvalidRequestError("temperature must be finite, got "
                                      + f"{params.temperature}")
        if params.top_k < -1:
            raise InvalidRequestError("top_k must be -1 or 0 (off) or >= 1, got "
                                      + f"{params.top_k}")
        seed = params.seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise InvalidRequestError(f"seed must be an integer or None, got {seed!r}")
        seats = self.scheduler.config.max_num_seqs
        if params.n > seats:
            raise InvalidRequestError(f"n = {params.n} sequences never fit the running batch "
                                      + f"(max_num_seqs = {seats})")


    def _new_sequence(self, request_id: int, ids: list[int], params: SamplingParams,
                      index: int) -> Sequence:
        seq = Sequence(next(self._seq_ids), request_id, ids, params, sample_index=index)
        seed = None if params.seed is None else params.seed + index
        self._generators[seq.seq_id] = make_generator(seed, self.model.device)
        return seq

    # %% chapters/11_engine.md § One step
    def step(self) -> list[RequestOutput]:
        """Schedule, run the model once (twice when prefills and decodes mix), sample,
        commit.

        Returns the requests that finished in this step (and forgets them).
        """
        t0 = time.perf_counter()
        out = self.scheduler.schedule()
        t1 = time.perf_counter()
        if out.is_empty:
            if self.scheduler.has_unfinished():
                raise EngineError("the scheduler found nothing to run although requests "
                                  + "are waiting: the cache is too small for any of them")
            return []
        picks = self._execute(out, self._sample)
        t2 = time.perf_counter()
        sampled, forks = {}, []
        for (seq, child), token in picks:
            if child is None:
                sampled[seq.seq_id] = token
            else:
                forks.append((seq, child, token))
        for parent, child, _ in forks:
            self._requests[parent.request_id].seqs.append(child)
        done = self.scheduler.commit(out, sampled, self.eos_token_id, forks)
        self._account(out, done, len(picks), t1 - t0 + time.perf_counter() - t2, t2 - t1)
        if self.check_invariants:
            self.scheduler.check_invariants()
        finished = []
        for request_id in dict.fromkeys(s.request_id for s in done):
            if self._requests[request_id].finished:
                finished.append(self._output(self._requests.pop(request_id)))
        return finished

    # %% chapters/11_engine.md § One step
    def _execute(self, out: SchedulerOutput, read):
        """Run a scheduled step (block moves, forward); return ``read(logits, samplers)``.

        If anything fails the step never happened: the scheduler takes its blocks back and
        the exception propagates.
        """
        try:
            self._move_blocks(out)
            logits, samplers = self._forward(out)
            return read(logits, samplers)
        except BaseException:
            self.scheduler.abort_step(out)
            raise


    def _move_blocks(self, out: SchedulerOutput) -> None:
        if out.swap_out:
            self.cache.swap_out(self.cpu_cache, out.swap_out)
        if out.swap_in:
            self.cache.swap_in(self.cpu_cache, out.swap_in)
        if out.reservation.copies:
            self.cache.copy_blocks(out.reservation.copies)

    # %% chapters/11_engine.md § Two batches per step
    def _forward(self, out: SchedulerOutput):
        """Run the step's chunks: decodes in one batch, prefills in another.

        Returns logits [rows, vocab] to sample from and, per row, ``(sequence, fork_child)``
        (the child is None except for the siblings of an ``n > 1`` request).
        """
        res, chunks = out.reservation, out.chunks
        parts, pick, samplers = [], [], []
        for group in self._groups(chunks):
            rows = None if len(group) == len(chunks) else group
            row = sum(len(p) for p in parts)  # this group's first row in the step's logits
            parts.append(self._run_group([chunks[i] for i in group], res, rows))
            for i in group:
                if not chunks[i].samples:
                    continue
                seq = chunks[i].seq
                pick.append(row)
                samplers.append((seq, None))
                if seq.params.n > 1:
                    for child in self._children_for(seq):
                        pick.append(row)
                        samplers.append((seq, child))
                row += 1
        logits = parts[0] if len(parts) == 1 else torch.cat(parts)
        if len(pick) != len(logits) or pick != list(range(len(pick))):
            logits = logits[torch.tensor(pick, device=logits.device)]
        return logits, samplers

    # %% chapters/11_engine.md § Two batches per step
    def _groups(self, chunks) -> list[list[int]]:
        """The step's chunks (indices) in forward groups: one-token decodes, then prefills."""
        decode = [i for i, c in enumerate(chunks) if c.num_tokens == 1]
        prefill = [i for i, c in enumerate(chunks) if c.num_tokens > 1]
        return [group for group in (decode, prefill) if group]

    # %% chapters/11_engine.md § Two batches per step
    def _run_group(self, chunks, res, rows) -> torch.Tensor:
        """One forward over ``chunks``, the step's sequences ``rows`` (None: all)."""
        ids = torch.tensor([t for c in chunks
                            for t in c.seq.token_ids(c.start, c.start + c.num_tokens)],
                           dtype=torch.long)
        ends = itertools.accumulate(c.num_tokens for c in chunks)
        logits_indices = torch.tensor([e - 1 for c, e in zip(chunks, ends) if c.samples],
                                      dtype=torch.long)
        return self._run_batch(ForwardBatch.from_reservation(res, ids, rows, logits_indices))


    def _run_batch(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits of one batch: a decode batch replayed as a CUDA graph when one fits."""
        if batch.is_decode:
            self.stats.kv_tokens_read += int(batch.seq_lens.sum())
            graphs = self._decode_graphs() if self.enable_cuda_graphs else None
            if graphs is not None and graphs.fits(batch):
                self.stats.graph_steps += 1
                return graphs.run(batch)
        return self.model(batch.to(self.model.device), self.cache)

    # %% chapters/11_engine.md § Two batches per step
    def _sample(self, logits, samplers) -> list:
        """One token per row: ``[((sequence, fork_child), token), ...]``."""
        if not samplers:
            return []
        seqs = [child or seq for seq, child in samplers]
        tokens = sample(logits, [s.params for s in seqs],
                        [self._generators[s.seq_id] for s in seqs])
        return list(zip(samplers, tokens.tolist()))


    def _account(self, out: SchedulerOutput, done: list[Sequence], num_sampled: int,
                 schedule_s: float, forward_s: float) -> None:
        stats = self.stats
        stats.steps += 1
        stats.schedule_seconds += schedule_s
        stats.forward_seconds += forward_s
        stats.prefill_tokens += out.stats.num_prefill_tokens
        stats.preemptions += len(out.preempted)
        stats.output_tokens += num_sampled
        stats.cached_prompt_tokens += sum(s.num_cached_prompt_tokens for s in out.admitted
                                          if s.num_preemptions == 0)
        self._account_finished(done)


    def _account_finished(self, done: list[Sequence]) -> None:
        """Each finished sequence's TTFT and TPOT; its generator is dropped."""
        stats = self.stats
        for seq in done:
            self._generators.pop(seq.seq_id, None)
            if seq.first_token_time is not None:
                stats.ttft.append(seq.first_token_time - seq.arrival_time)
                if len(seq.output_token_ids) > 1:
                    stats.tpot.append((seq.finish_time - seq.first_token_time)
                                      / (len(seq.output_token_ids) - 1))

    # %% chapters/11_engine.md § generate
    def generate(self, prompts,
                 sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Generate for every prompt; one ``RequestOutput`` per prompt, in prompt order.

        ``prompts``: token-id lists, or strings when a tokenizer exists (one prompt alone is
        fine). A prompt that can never be served comes back with ``error`` set; the others
        are served.
        """
        prompts = _prompt_list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params or SamplingParams()] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(sampling_params)} "
                             + "SamplingParams")
        self.stats = RunStats()
        ids, results = [], {}
        bar = None
        try:
            for prompt, params in zip(prompts, sampling_params):
                try:
                    ids.append(self.add_request(prompt, params))
                except PromptTooLongError as error:
                    ids.append(self._refuse(prompt, params, error, results))
            if use_tqdm:
                from tqdm.auto import tqdm
                bar = tqdm(total=len(ids), desc="generate", unit="req")
            while self.has_unfinished_requests():
                finished = self.step()
                results.update((o.request_id, o) for o in finished)
                if bar is not None:
                    bar.update(len(finished))
        except BaseException:
            self._abort_all(ids)  # this call's requests go, so the next call starts clean
            raise
        finally:
            if bar is not None:
                bar.close()
        return [results[i] for i in ids]


    def _output(self, request: _Request) -> RequestOutput:
        outputs = []
        for seq in sorted(request.seqs, key=lambda s: s.sample_index):
            text = (self.tokenizer.decode(seq.output_token_ids)
                    if self.tokenizer is not None else None)
            outputs.append(CompletionOutput(seq.sample_index, list(seq.output_token_ids),
                                            text, seq.finish_reason))
        first = request.seqs[0] if request.seqs else None
        metrics = {} if first is None else {
            "arrival_time": first.arrival_time, "first_token_time": first.first_token_time,
            "finish_time": max(s.finish_time or 0 for s in request.seqs),
            "num_preemptions": sum(s.num_preemptions for s in request.seqs),
            "num_cached_tokens": first.num_cached_prompt_tokens}
        return RequestOutput(request.request_id, request.prompt, request.prompt_token_ids,
                             outputs, request.finished, request.error, metrics)

    # %% chapters/11_engine.md § Metrics
    def last_run_stats(self) -> dict:
        """The counters of the last ``generate`` call (steps, tokens, hit rate, ...)."""
        return self.stats.summary()

    # %% chapters/11_engine.md § Parallel sampling and seeds
    def _children_for(self, seq: Sequence) -> list[Sequence]:
        """The n - 1 siblings a request forks off its first sequence at its first sample."""
        request = self._requests[seq.request_id]
        if seq.sample_index != 0 or seq.output_token_ids or len(request.seqs) > 1:
            return []
        return [self._new_sequence(seq.request_id, seq.prompt_token_ids, seq.params, i)
                for i in range(1, seq.params.n)]

    # %% chapters/11_engine.md § Cancellation and errors
    def abort_request(self, request_id: int) -> RequestOutput:
        """Cancel a request now: its sequences stop, their blocks are freed; its output."""
        request = self._requests.pop(request_id, None)
        if request is None:
            raise KeyError(f"unknown or already finished request {request_id}")
        request.aborted = True
        for seq in request.seqs:
            self._generators.pop(seq.seq_id, None)
            if not seq.status.finished:
                self.scheduler.abort(seq.seq_id)
        return self._output(request)


    def _abort_all(self, request_ids: list[int]) -> None:
        """Abort those of ``request_ids`` still in flight (after a failed ``generate``)."""
        for request_id in request_ids:
            if request_id in self._requests:
                self.abort_request(request_id)


    def _refuse(self, prompt, params: SamplingParams, error: Exception,
                results: dict) -> int:
        """Record a prompt that can never be served as an output with ``error`` set."""
        request_id = next(self._request_ids)
        text, tokens = self._tokenize(prompt)
        results[request_id] = self._output(_Request(request_id, text, tokens, params, [],
                                                    str(error)))
        return request_id

    # %% chapters/11_engine.md § Beam search on fork and copy-on-write
    def beam_search(self, prompts, beam_width: int,
                    max_tokens: int) -> list[BeamSearchOutput]:
        """Beam search, one prompt after another, on an idle engine (as in vLLM).

        Each step extends every beam by one token and keeps the ``beam_width`` best (beam,
        token) pairs by summed log-probability. A beam chosen twice is **forked**: the
        copies share all blocks, and copy-on-write (the reservation's ``copies``) separates
        them at the first block they write differently. Beams not chosen are released.
        End-of-sequence is ignored.
        """
        if self.has_unfinished_requests():
            raise EngineError("beam_search needs an idle engine: finish or abort the "
                              + "running requests")
        if beam_width < 1 or max_tokens < 1:
            raise ValueError(f"beam_width and max_tokens must be >= 1, got {beam_width}, "
                             + f"{max_tokens}")
        prompts = _prompt_list(prompts)
        return [self._beam_search_one(self._tokenize(p)[1], beam_width, max_tokens)
                for p in prompts]


    def _beam_search_one(self, prompt: list[int], width: int,
                         max_tokens: int) -> BeamSearchOutput:
        manager = self.manager
        self.scheduler.check_prompt(len(prompt) + max_tokens - 1)
        root = Sequence(next(self._seq_ids), -1, list(prompt),
                        SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        start = manager.allocate_prompt(root.seq_id, prompt)
        beams = [(root, 0.0)]  # (sequence, summed log-probability of its output)
        copies = 0
        try:
            for step in range(max_tokens):
                out = self._beam_step(beams, len(prompt) - start if step == 0 else 1)
                copies += len(out.reservation.copies)
                logprobs = self._execute(out, self._log_probs)
                manager.commit_step(out.reservation)
                scores = torch.tensor([b[1] for b in beams], device=logprobs.device)
                top = (scores[:, None] + logprobs).flatten().topk(
                    min(width, logprobs.numel()))
                vocab = logprobs.shape[1]
                chosen = [(int(i) // vocab, int(i) % vocab, float(v))
                          for i, v in zip(top.indices.tolist(), top.values.tolist())]
                beams = self._next_beams(beams, chosen)
            ranked = sorted(beams, key=lambda b: -b[1])
            return BeamSearchOutput(list(prompt), [b[0].output_token_ids for b in ranked],
                                    [b[1] for b in ranked], copies)
        finally:
            for seq, _ in beams:
                if seq.seq_id in manager:
                    manager.release_sequence(seq.seq_id)

    # %% chapters/11_engine.md § Beam search on fork and copy-on-write
    @staticmethod
    def _log_probs(logits: torch.Tensor, samplers) -> torch.Tensor:
        """Every row's next-token log-probabilities (a beam step samples nothing)."""
        return logits.float().log_softmax(-1)


    def _beam_step(self, beams, n: int) -> SchedulerOutput:
        """The step that runs the last ``n`` tokens of every beam, its blocks reserved."""
        chunks = [ScheduledChunk(seq, seq.num_tokens - n, n) for seq, _ in beams]
        reservation = self.manager.reserve_step({seq.seq_id: n for seq, _ in beams})
        return SchedulerOutput(chunks=chunks, reservation=reservation)


    def _next_beams(self, beams, chosen):
        """Fork beams chosen more than once, release the unchosen, record the tokens."""
        manager, taken, result = self.manager, set(), []
        for parent, token, score in chosen:
            seq = beams[parent][0]
            seq_id = seq.seq_id
            if parent in taken:  # a second continuation of the same beam: share its blocks
                seq_id = next(self._seq_ids)
                manager.fork(seq.seq_id, seq_id)
            taken.add(parent)
            tokens = seq.output_token_ids + [token]
            result.append((replace(seq, seq_id=seq_id, output_token_ids=tokens), score))
        for index, (seq, _) in enumerate(beams):
            if index not in taken:
                manager.release_sequence(seq.seq_id)
        for seq, _ in result:  # after the forks: no child inherits a sibling's token
            manager.append_token_ids(seq.seq_id, seq.output_token_ids[-1:])
        return result

    # %% chapters/11_engine.md § CUDA graphs for decode
    def _decode_graphs(self) -> DecodeGraphs | None:
        """The captured decode graphs (captured on first use), or None when they are off."""
        if self._graphs is None and self.enable_cuda_graphs:
            max_blocks = blocks_needed(self.max_model_len, self.cache.block_size)
            self._graphs = DecodeGraphs(self.model, self.cache,
                                        self.scheduler.config.max_num_seqs, max_blocks)
        return self._graphs


# %% chapters/11_engine.md § Beam search on fork and copy-on-write
@dataclass
class BeamSearchOutput:
    """``LLM.beam_search`` per prompt: the ``beam_width`` best continuations, best
    first, with their summed log-probabilities, and how many copy-on-write block copies
    separating the beams took."""

    prompt_token_ids: list[int]
    sequences: list[list[int]]
    cumulative_logprobs: list[float]
    num_cow_copies: int


# %% chapters/11_engine.md § CUDA graphs for decode
class DecodeGraphs:
    """The decode forward captured as CUDA graphs, one per batch-size bucket, replayed.

    A decode step of a small model is well over a thousand short kernels; launching them
    one by one from Python takes longer than running them. Capture records the launches
    once into a graph per bucket (1, 2, 4, ... up to ``max_batch``) over static input
    buffers; a step copies its inputs into the buffers, pads the batch to the next
    bucket (padding rows write to slot -1, i.e. nowhere, and have length 0) and replays.
    Block tables are ``max_blocks`` wide, so the same graph serves every context length.
    """

    def __init__(self, model: Qwen3PagedModel, cache, max_batch: int,
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
        for b in reversed(self.buckets):  # largest first: smaller graphs reuse its pool
            batch = self._batch(b)
            model(batch, cache)  # compile and warm up outside the capture
            torch.cuda.synchronize(device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[b] = model(batch, cache)
            pool = graph.pool()
            self.graphs[b] = graph

    # %% chapters/11_engine.md § CUDA graphs for decode
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
