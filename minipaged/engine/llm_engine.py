# GENERATED from chapters/12_engine.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/12_engine.md § The exported engine
"""The serving engine: vLLM's offline API on chapters 4-10's pieces, assembled from parts."""

from __future__ import annotations

import functools
import itertools
import math
import numbers
import operator
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import torch

from minipaged.memory.block_table import blocks_needed
from minipaged.kernels.kv_cache import ATTENTION_BACKENDS
from minipaged.engine.detokenizer import IncrementalDetokenizer
from minipaged.engine.model_runner import ModelRunner
from minipaged.memory.prefix_cache import PrefixCachingBlockManager
from minipaged.model.qwen3 import Qwen3PagedModel
from minipaged.runtime import NO_TRITON, TritonNotInstalledError, default_device, has_triton
from minipaged.engine.sampler import Sampler
from minipaged.engine.scheduler import (PromptTooLongError, SamplingParams, Scheduler,
                                        SchedulerConfig, SchedulerOutput, Sequence, SequenceStatus)
from minipaged.memory.sizing import block_bytes, blocks_in_budget, kv_bytes_per_token

__all__ = [
    "CompletionOutput", "RequestOutput", "BeamSearchOutput", "RunStats", "EngineError",
    "InvalidRequestError", "CacheFormat", "MODEL_DTYPE_CACHE",
    "resolve_attention_backend", "StepLoop", "EngineParts", "LLMEngine",
    "EngineBusyError", "OutputProcessor",
]


class EngineError(RuntimeError):
    """The engine cannot make progress (for example a step that schedules nothing)."""


class InvalidRequestError(ValueError):
    """A request that is wrong in itself (a token id outside the vocabulary, a float
    token, a sampling setting out of range); nothing of it was queued."""


class EngineBusyError(EngineError):
    """A call reached the engine while another call was running in it: from a second
    thread, or from inside a step (a model hook, a callback). Nothing of it was done."""


# %% chapters/12_engine.md § The exported engine
def exclusive(method):
    """One caller at a time: a call from another thread while a call runs, or any call
    while a step runs, is refused with ``EngineBusyError``; the calls one call makes of
    the engine between steps (``generate`` adds its requests, then steps) pass."""

    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        me = threading.get_ident()
        with self._entry:
            other_thread = self._owner not in (None, me)
            if self._stepping or other_thread:
                where = "from another thread" if other_thread else "inside a step"
                raise EngineBusyError(
                    f"{method.__name__}() reached the engine {where} while another call "
                    + "runs in it: drive an engine from one thread, one call at a time "
                    + "(a server runs one loop that owns the engine)")
            self._owner, self._depth = me, self._depth + 1
        try:
            return method(self, *args, **kwargs)
        finally:
            with self._entry:
                self._depth -= 1
                if self._depth == 0:
                    self._owner = None

    return guarded


# %% chapters/12_engine.md § What generate returns
@dataclass
class CompletionOutput:
    """One generated continuation of a prompt (``n`` of them per request).

    ``text`` is ``None`` without a tokenizer. ``stop_reason`` is the stop string or the
    stop token id that ended it (``None`` for an end-of-sequence token or a length).
    With ``SamplingParams(logprobs=k)``, ``logprobs`` holds per generated token a dict
    ``{token_id: log-probability}`` of the sampled token and the ``k`` most likely ones,
    and ``cumulative_logprob`` their sampled tokens' sum; both are ``None`` otherwise.
    Log-probabilities are those of the model's raw logits (before temperature, top-k
    and top-p), as vLLM reports by default.
    """

    index: int
    token_ids: list[int]
    text: str | None
    finish_reason: str | None
    stop_reason: str | int | None = None
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, float]] | None = None


@dataclass
class RequestOutput:
    """What ``LLM.generate`` returns per prompt, in prompt order (vLLM's field names).

    ``error`` is set, and ``outputs`` empty, for a request the engine refused (too long
    a prompt); the other requests of the batch are served normally. ``metrics`` holds
    arrival, first-token and finish times (seconds, ``time.perf_counter``), preemptions
    and prompt tokens found cached.
    """

    request_id: str
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

    # %% chapters/12_engine.md § Metrics
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


# %% chapters/12_engine.md § The LLMEngine class
@dataclass
class _Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence]
    error: str | None = None
    aborted: bool = False
    texts: dict[int, IncrementalDetokenizer] = field(default_factory=dict)  # per sample
    logprobs: dict[int, list[dict[int, float]]] = field(default_factory=dict)
    cumulative_logprob: dict[int, float] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.error is not None or (
            (self.aborted or len(self.seqs) == self.params.n)
            and all(s.status.finished for s in self.seqs))


def _prompt_list(prompts) -> list:
    """A list of prompts: one prompt alone (text or token ids) becomes a list of one. A
    tensor or array of token ids is one prompt (1-D) or a batch of prompts (2-D)."""
    if hasattr(prompts, "tolist") and not isinstance(prompts, (str, list)):
        prompts = prompts.tolist()
    one = isinstance(prompts, str) or (prompts and isinstance(prompts[0], numbers.Integral))
    return [prompts] if one else prompts


# %% chapters/12_engine.md § The LLMEngine class
def _load_model(model, tokenizer, device, dtype: torch.dtype | None = None):
    if isinstance(model, str):  # a name or a path: chapter 9's loader
        from minipaged.model.qwen3 import load_model

        model, tokenizer = load_model(model, device=device or default_device(), dtype=dtype)
    if not isinstance(model, Qwen3PagedModel):
        generation_config = getattr(model, "generation_config", None)  # its EOS ids
        model = Qwen3PagedModel.from_hf(model)
        model.generation_config = generation_config
    if device is not None:
        model = model.to(device)
    if dtype is not None and model.dtype != dtype:  # new tensors: the caller's stay
        model = model.to(dtype)
    return model, tokenizer


MODEL_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                "float16": torch.float16}


def _model_dtype(dtype) -> torch.dtype | None:
    """``dtype`` as a ``torch.dtype``; ``None`` for ``"auto"`` (the model's own)."""
    if dtype == "auto":
        return None
    if isinstance(dtype, torch.dtype) and dtype in MODEL_DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in MODEL_DTYPES:
        return MODEL_DTYPES[dtype]
    raise ValueError(f"dtype must be 'auto', one of {sorted(MODEL_DTYPES)} or the torch "
                     + f"dtype of one, got {dtype!r}")


def _eos_ids(config, tokenizer, generation_config=None) -> list[int]:
    """Every end-of-sequence id: the tokenizer's, the config's, then the generation
    config's (each one id or a list)."""
    ids = []
    for source in (tokenizer, config, generation_config):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        for token in eos if isinstance(eos, (list, tuple)) else [eos]:
            if token is not None and token not in ids:
                ids.append(token)
    return ids


# %% chapters/12_engine.md § The LLMEngine class
class CacheFormat(NamedTuple):
    """How an engine stores K/V: ``new_cache(model, num_blocks, block_size)`` builds the
    pool, ``block_bytes(model, block_size)`` is what one block costs (for sizing),
    ``backends`` the attention backends its caches implement."""

    new_cache: Callable
    block_bytes: Callable
    backends: tuple[str, ...] = ATTENTION_BACKENDS


def _new_model_dtype_cache(model, num_blocks: int, block_size: int):
    return model.new_cache(num_blocks, block_size)


def _model_dtype_block_bytes(model, block_size: int) -> int:
    c = model.config
    per_token = kv_bytes_per_token(c.num_hidden_layers, c.num_key_value_heads,
                                   c.head_dim, model.dtype.itemsize)
    return block_bytes(per_token, block_size)


MODEL_DTYPE_CACHE = CacheFormat(_new_model_dtype_cache, _model_dtype_block_bytes)
"""``kv_cache_dtype="auto"``: chapter 7's ``PagedKVCache`` in the model's dtype."""


def resolve_attention_backend(name: str, device: torch.device | str,
                              available: tuple[str, ...] = ATTENTION_BACKENDS) -> str:
    """The attention backend an engine on ``device`` uses for ``name``: ``"auto"`` is
    Triton on a GPU and PyTorch elsewhere (Triton on a CPU only interprets, and may not be
    installed), when the cache format has a PyTorch path (``available``); a name it lacks
    raises, and so does Triton where it is not installed (``TritonNotInstalledError``)."""
    choices = ("auto", *ATTENTION_BACKENDS)
    if name not in choices:
        raise ValueError(f"attention_backend must be one of {choices}, got {name!r}")
    if name == "auto":
        compiled = torch.device(device).type == "cuda" and has_triton()
        name = "torch" if not compiled and "torch" in available else "triton"
    elif name not in available:
        raise ValueError(f"this kv_cache_dtype has no {name!r} attention backend (only "
                         + f"{list(available)}): use attention_backend='auto' or "
                         + "kv_cache_dtype='auto'")
    if name == "triton" and not has_triton():
        raise TritonNotInstalledError(f"the Triton attention backend: {NO_TRITON}")
    return name


# %% chapters/12_engine.md § The LLMEngine class
def _check_engine_args(device, gpu_memory_utilization, kv_cache_dtype: str,
                       cache_formats: Mapping) -> None:
    """Raise ``ValueError`` for a cache format, a device or a memory fraction the engine
    cannot use."""
    if kv_cache_dtype not in cache_formats:
        raise ValueError(f"kv_cache_dtype must be one of {sorted(cache_formats)}, "
                         + f"got {kv_cache_dtype!r}")
    if (device is not None and torch.device(device).type == "cuda"
            and not torch.cuda.is_available()):
        raise ValueError(f"device='{torch.device(device)}' but no CUDA GPU is available: "
                         + "use device='cpu' or None")
    if (not isinstance(gpu_memory_utilization, numbers.Real)
            or not 0 < gpu_memory_utilization <= 1):
        raise ValueError("gpu_memory_utilization must be a fraction in (0, 1], got "
                         + f"{gpu_memory_utilization!r}")


def _model_len(max_model_len: int | None, positions: int) -> int:
    """``max_model_len`` checked against the model's positions (``None``: all of them)."""
    if max_model_len is None:
        return positions
    if (isinstance(max_model_len, bool) or not isinstance(max_model_len, numbers.Integral)
            or not 1 <= max_model_len <= positions):
        raise ValueError(f"max_model_len must be an integer in [1, {positions}] (the "
                         + "model's positions) or None (all of them), got "
                         + f"{max_model_len!r}")
    return int(max_model_len)


# %% chapters/12_engine.md § The LLMEngine class
class LLMEngine:
    """Offline batched generation on a paged KV cache, with vLLM's API: ``generate``
    for a batch of prompts, and ``add_request`` / ``step`` / ``abort_request`` for a
    loop that serves requests as they come.

    ``model`` is a transformers ``Qwen3ForCausalLM`` (its weights are shared, not
    copied), a ``Qwen3PagedModel``, or a hub id / local path (needs the network or a
    local copy). ``parts`` are the pieces the engine is assembled from
    (``EngineParts()``: this chapter's); ``kv_cache_dtype`` names one of its cache
    formats. ``num_blocks=None`` sizes the cache from free GPU memory
    (``gpu_memory_utilization`` of the card, minus what is already used), or to a small
    default on CPU. ``attention_backend``: see ``resolve_attention_backend``. ``dtype``:
    ``"auto"`` (the model's), ``"float32"``, ``"bfloat16"``, ``"float16"`` or a
    ``torch.dtype``; another converts the engine's copy of the weights.
    """

    CPU_DEFAULT_BLOCKS = 1024

    # %% chapters/12_engine.md § The LLMEngine class
    def __init__(self, model, *, parts: EngineParts | None = None, tokenizer=None,
                 dtype: str | torch.dtype = "auto",
                 device: torch.device | str | None = None, block_size: int = 16,
                 num_blocks: int | None = None, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 8192, max_model_len: int | None = None,
                 enable_prefix_caching: bool = True, enable_chunked_prefill: bool = False,
                 kv_cache_dtype: str = "auto", gpu_memory_utilization: float = 0.9,
                 policy: str = "decode_first", preemption_mode: str = "recompute",
                 num_cpu_blocks: int | None = None, enable_cuda_graphs: bool | None = None,
                 check_invariants: bool = False, attention_backend: str = "auto") -> None:
        parts = parts or EngineParts()
        _check_engine_args(device, gpu_memory_utilization, kv_cache_dtype, parts.cache_formats)
        cache_format = parts.cache_formats[kv_cache_dtype]
        generation_config = getattr(model, "generation_config", None)
        model, self.tokenizer = _load_model(model, tokenizer, device, _model_dtype(dtype))
        self.attention_backend = resolve_attention_backend(attention_backend, model.device,
                                                           cache_format.backends)
        self.model = parts.prepare_model(model)
        config = self.model.config
        self.max_model_len = _model_len(max_model_len, config.max_position_embeddings)
        if num_blocks is None:
            num_blocks = self._auto_num_blocks(cache_format.block_bytes(self.model, block_size),
                                               gpu_memory_utilization, max_num_batched_tokens)
        self.cache = cache_format.new_cache(self.model, num_blocks, block_size)
        self.cache.attention_backend = self.attention_backend
        if preemption_mode == "swap" and num_cpu_blocks is None:
            num_cpu_blocks = num_blocks
        cpu_cache = self.cache.cpu_pool(num_cpu_blocks) if num_cpu_blocks else None
        # chapter 6's manager: sharing, copy-on-write, a CPU pool, prefix caching
        self.manager = PrefixCachingBlockManager(num_blocks, block_size, num_cpu_blocks or 0,
                                                 enable_prefix_caching=enable_prefix_caching)
        self.scheduler = parts.scheduler(self.manager, SchedulerConfig(
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=self.max_model_len, policy=policy,
            preemption_mode=preemption_mode,
            enable_chunked_prefill=enable_chunked_prefill))
        self.stats = RunStats()
        # a CUDA graph replays GPU work only: the PyTorch backend's writes ask the host
        graphable = self.model.device.type == "cuda" and self.attention_backend == "triton"
        self.runner = ModelRunner(
            self.model, self.cache, cpu_cache, parts.sampler(self.model.device), self.stats,
            max_num_seqs=max_num_seqs, max_model_len=self.max_model_len,
            enable_cuda_graphs=graphable if enable_cuda_graphs is None
            else enable_cuda_graphs and graphable,
            single_forward=parts.single_forward)
        self.loop = parts.step_loop(self)
        self.check_invariants = check_invariants
        eos = _eos_ids(config, self.tokenizer,
                       getattr(model, "generation_config", generation_config))
        self.eos_token_id = eos[0] if eos else None
        self.extra_eos_token_ids = tuple(eos[1:])  # stop tokens of every request
        self.requests: dict[str, _Request] = {}
        self.output_processor = OutputProcessor(self.tokenizer, tuple(eos), self.requests)
        self._request_ids = itertools.count()
        self._seq_ids = itertools.count()
        self._entry = threading.Lock()  # guards the three fields below (``exclusive``)
        self._owner, self._depth, self._stepping = None, 0, False

    # %% chapters/12_engine.md § The LLMEngine class
    def _auto_num_blocks(self, per_block: int, utilization: float, max_tokens: int) -> int:
        c, device = self.model.config, self.model.device
        if device.type != "cuda":
            return self.CPU_DEFAULT_BLOCKS
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

    @exclusive
    def add_request(self, prompt, params: SamplingParams | None = None,
                    request_id: str | None = None) -> str:
        """Queue one prompt (token ids, or text with a tokenizer); returns its request id,
        ``request_id`` if given (a string no unfinished request has), else a fresh one.

        Raises ``InvalidRequestError`` for a malformed request and ``PromptTooLongError``
        for one that can never be served; either way nothing is queued.
        """
        params = params or SamplingParams()
        request_id = _request_id(request_id, self)
        text, ids = self._tokenize(prompt)
        _check_request(ids, params, self.model.config.vocab_size, self.scheduler,
                       self.tokenizer is not None)
        self.scheduler.check_prompt(len(ids))
        _check_fits_cache(len(ids), params, self.scheduler)
        if self.extra_eos_token_ids and not params.ignore_eos:  # a copy: the caller's stays
            params = replace(params, stop_token_ids=(*params.stop_token_ids,
                                                     *self.extra_eos_token_ids))
        seq = self._new_sequence(request_id, ids, params, 0)
        self.requests[request_id] = _Request(request_id, text, ids, params, [seq])
        self.scheduler.add(seq)
        self.stats.prompt_tokens += len(ids)
        return request_id

    def has_unfinished_requests(self) -> bool:
        """Whether any added request is still waiting, running, swapped out or in flight."""
        return self.loop.in_flight() or self.scheduler.has_unfinished()

    # %% chapters/12_engine.md § The LLMEngine class
    def _tokenize(self, prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise TypeError("text prompts need a tokenizer: pass token ids, "
                                + "or a model with one")
            return prompt, list(self.tokenizer(prompt)["input_ids"])
        if hasattr(prompt, "tolist"):  # a tensor or an array of token ids
            prompt = prompt.tolist()
        try:
            return None, [operator.index(t) for t in prompt]
        except TypeError:
            shown = list(prompt)[:8] if hasattr(prompt, "__iter__") else prompt
            raise InvalidRequestError(f"token ids must be integers, got {shown}") from None

    def _new_sequence(self, request_id: str, ids: list[int], params: SamplingParams,
                      index: int) -> Sequence:
        seq = Sequence(next(self._seq_ids), request_id, ids, params, sample_index=index)
        self.runner.sampler.add(seq)
        return seq

    # %% chapters/12_engine.md § One step
    @exclusive
    def step(self) -> list[RequestOutput]:
        """One step of the engine's loop. Returns the requests that finished in it (and
        forgets them)."""
        self._stepping = True
        try:
            finished = self.loop.step()
        finally:
            self._stepping = False
        if self.check_invariants:
            self.scheduler.check_invariants()
        return finished

    def run(self, out: SchedulerOutput, read):
        """Run a scheduled step on the model runner; return ``read(logits, rows)``.

        If anything fails the step never happened: the scheduler takes its blocks back and
        the exception propagates.
        """
        try:
            return self.runner.execute(out, read, self.children_for)
        except BaseException:
            self.scheduler.abort_step(out)
            raise

    # %% chapters/12_engine.md § One step
    def account(self, out: SchedulerOutput, num_sampled: int, schedule_s: float,
                forward_s: float) -> None:
        """Add a step to the run's counters."""
        stats = self.stats
        stats.steps += 1
        stats.schedule_seconds += schedule_s
        stats.forward_seconds += forward_s
        stats.prefill_tokens += out.stats.num_prefill_tokens
        stats.preemptions += len(out.preempted)
        stats.output_tokens += num_sampled
        stats.cached_prompt_tokens += sum(s.num_cached_prompt_tokens for s in out.admitted
                                          if s.num_preemptions == 0)

    def finish(self, done: list[Sequence], complete=None) -> list[RequestOutput]:
        """Account the finished sequences ``done`` (TTFT, TPOT; their random streams go)
        and return the outputs of the requests now finished, forgetting them.
        ``complete(request)`` may hold one back (chapter 15: a token still on the GPU)."""
        stats, outputs = self.stats, []
        for seq in done:
            self.runner.sampler.drop(seq.seq_id)
            if seq.first_token_time is not None:
                stats.ttft.append(seq.first_token_time - seq.arrival_time)
                if len(seq.output_token_ids) > 1:
                    stats.tpot.append((seq.finish_time - seq.first_token_time)
                                      / (len(seq.output_token_ids) - 1))
        for request_id in dict.fromkeys(s.request_id for s in done):
            request = self.requests.get(request_id)
            if request is not None and request.finished and (complete is None
                                                              or complete(request)):
                outputs.append(self.output_processor.output(self.requests.pop(request_id)))
        return outputs

    # %% chapters/12_engine.md § generate
    @exclusive
    def generate(self, prompts,
                 sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Generate for every prompt; one ``RequestOutput`` per prompt, in prompt order.

        ``prompts``: token-id lists, or strings when a tokenizer exists (one prompt alone is
        fine; a 2-D tensor or array is a batch). A prompt that can never be served comes back
        with ``error`` set; the others are served. Raises ``EngineError`` while requests
        queued with ``add_request`` are unfinished.
        """
        if self.has_unfinished_requests():
            raise EngineError("generate() would take over the requests queued with "
                              + "add_request() and lose their outputs: finish them with step() "
                              + "or abort them with abort_request() first")
        prompts = _prompt_list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params or SamplingParams()] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(sampling_params)} "
                             + "SamplingParams")
        self.stats = self.runner.stats = RunStats()
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

    # %% chapters/12_engine.md § Text out
    @exclusive
    def request_output(self, request_id: str, since: dict | None = None) -> RequestOutput:
        """The output so far of a request ``step`` has not returned (what a server streams):
        its text only grows, and ``finished`` stays False until ``step`` returns it. With
        ``since`` (sample index -> tokens and characters already read), only what is new."""
        found = self.request_outputs({request_id: since or {}})  # defined below
        if not found:
            raise KeyError(f"unknown or already finished request {request_id!r}")
        return found[0]

    # %% chapters/12_engine.md § Text out
    @exclusive
    def request_outputs(self, since: dict[str, dict]) -> list[RequestOutput]:
        """``request_output(id, since[id])`` of each request of ``since`` in one call: what a
        server streams after a step. Ids the engine does not know (any more) are left out."""
        ready, outputs = {o.request_id: o for o in self.loop.ready}, []
        for request_id, read in since.items():
            if request_id in ready:  # finished: its tail, cut from the whole output
                outputs.append(replace(ready[request_id], outputs=[completion_tail(
                    c, *read.get(c.index, (0, 0))) for c in ready[request_id].outputs]))
            elif request_id in self.requests:
                output = self.output_processor.output(self.requests[request_id], read)
                outputs.append(replace(output, finished=False) if output.finished else output)
        return outputs

    # %% chapters/12_engine.md § Metrics
    def last_run_stats(self) -> dict:
        """The counters of the last ``generate`` call (steps, tokens, hit rate, ...)."""
        return self.stats.summary()

    # %% chapters/12_engine.md § Parallel sampling and seeds
    def children_for(self, seq: Sequence) -> list[Sequence]:
        """The n - 1 siblings a request forks off its first sequence at its first sample."""
        request = self.requests[seq.request_id]
        if seq.sample_index != 0 or seq.output_token_ids or len(request.seqs) > 1:
            return []
        return [self._new_sequence(seq.request_id, seq.prompt_token_ids, seq.params, i)
                for i in range(1, seq.params.n)]

    # %% chapters/12_engine.md § Cancellation and errors
    @exclusive
    def abort_request(self, request_id: str) -> RequestOutput:
        """Cancel a request now: its sequences stop, their blocks are freed; its output."""
        self.loop.settle()  # its tokens in flight first: its output holds no placeholder
        for i, output in enumerate(self.loop.ready):
            if output.request_id == request_id:  # it finished before the cancellation
                return self.loop.ready.pop(i)
        request = self.requests.pop(request_id, None)
        if request is None:
            raise KeyError(f"unknown or already finished request {request_id}")
        request.aborted = True
        for seq in request.seqs:
            self.runner.sampler.drop(seq.seq_id)
            if not seq.status.finished:
                self.scheduler.abort(seq.seq_id)
        return self.output_processor.output(request)

    def _abort_all(self, request_ids: list[str]) -> None:
        """Abort those of ``request_ids`` still in flight (after a failed ``generate``)."""
        for request_id in request_ids:
            if request_id in self.requests:
                self.abort_request(request_id)

    def _refuse(self, prompt, params: SamplingParams, error: Exception,
                results: dict) -> str:
        """Record a prompt that can never be served as an output with ``error`` set."""
        request_id = _request_id(None, self)
        text, tokens = self._tokenize(prompt)
        results[request_id] = self.output_processor.output(_Request(request_id, text, tokens, params, [],
                                                    str(error)))
        return request_id

    # %% chapters/12_engine.md § Beam search on fork and copy-on-write
    @exclusive
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
        self._stepping = True  # its steps run the model as step() does
        try:
            return [self._beam_search_one(self._tokenize(p)[1], beam_width, max_tokens)
                    for p in prompts]
        finally:
            self._stepping = False

    # %% chapters/12_engine.md § Beam search on fork and copy-on-write
    def _beam_search_one(self, prompt: list[int], width: int,
                         max_tokens: int) -> BeamSearchOutput:
        scheduler = self.scheduler
        scheduler.check_prompt(len(prompt) + max_tokens - 1)
        root = Sequence(next(self._seq_ids), -1, list(prompt),
                        SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        scheduler.add(root)
        beams = [(root, 0.0)]  # (sequence, summed log-probability of its output)
        copies = 0
        try:
            while len(beams[0][0].output_token_ids) < max_tokens:
                out = self._beam_step(beams)
                copies += len(out.reservation.copies)
                logprobs, seqs = self.run(out, _beam_log_probs)
                if not seqs:  # a chunk of the prompt, nothing to choose from yet
                    scheduler.commit(out, {})
                    continue
                row = {seq.seq_id: i for i, seq in enumerate(seqs)}
                order = [row[seq.seq_id] for seq, _ in beams]
                if order != list(range(len(order))):  # rows in the beams' order
                    logprobs = logprobs[torch.tensor(order, device=logprobs.device)]
                scores = torch.tensor([b[1] for b in beams], device=logprobs.device)
                top = (scores[:, None] + logprobs).flatten().topk(
                    min(width, logprobs.numel()))
                vocab = logprobs.shape[1]
                chosen = [(int(i) // vocab, int(i) % vocab, float(v))
                          for i, v in zip(top.indices.tolist(), top.values.tolist())]
                beams = _next_beams(self.scheduler, self._seq_ids, out, beams, chosen, logprobs)
            ranked = sorted(beams, key=lambda b: -b[1])
            return BeamSearchOutput(list(prompt), [b[0].output_token_ids for b in ranked],
                                    [b[1] for b in ranked], copies)
        finally:  # the engine was idle: whatever the scheduler still holds is a beam
            for seq in [*scheduler.waiting, *scheduler.running, *scheduler.swapped]:
                scheduler.abort(seq.seq_id)

    # %% chapters/12_engine.md § Beam search on fork and copy-on-write
    def _beam_step(self, beams) -> SchedulerOutput:
        """The scheduler's next step, which must run every beam (and nothing else)."""
        out = self.scheduler.schedule()
        if out.preempted or len(out.chunks) != len(beams):
            self.scheduler.abort_step(out)
            raise EngineError(f"the KV cache cannot hold {len(beams)} beams: give it more "
                              + "blocks (num_blocks) or lower beam_width or max_tokens")
        return out


# %% chapters/12_engine.md § The LLMEngine class
def _check_request(ids: list[int], params: SamplingParams, vocab: int,
                   scheduler: Scheduler, has_tokenizer: bool = True) -> None:
    """Raise ``InvalidRequestError`` if the request can never be valid."""
    if not isinstance(params, SamplingParams):
        raise InvalidRequestError("expected SamplingParams, got "
                                  + type(params).__name__)
    if params.stop and not has_tokenizer:
        raise InvalidRequestError("stop strings need a tokenizer: give the engine one, "
                                  + "or stop on token ids (stop_token_ids)")
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
    seats = scheduler.config.max_num_seqs
    if params.n > seats:
        raise InvalidRequestError(f"n = {params.n} sequences never fit the running batch "
                                  + f"(max_num_seqs = {seats})")


def _check_fits_cache(num_prompt_tokens: int, params: SamplingParams,
                      scheduler: Scheduler) -> None:
    """Raise ``PromptTooLongError`` if prompt + ``max_tokens`` can never fit the cache."""
    tokens = min(num_prompt_tokens + params.max_tokens, scheduler.config.max_model_len)
    blocks = blocks_needed(tokens, scheduler.block_size)
    usable = scheduler.num_total_blocks - scheduler.config.watermark_blocks
    if blocks > usable:
        raise PromptTooLongError(
            f"prompt of {num_prompt_tokens} tokens + max_tokens={params.max_tokens} needs "
            + f"{blocks} KV blocks but the cache has {usable}: give it more blocks "
            + "(num_blocks), lower max_tokens or shorten the prompt")


# %% chapters/12_engine.md § One step
class StepLoop:
    """How the engine steps: schedule, run the model, sample, commit, one step after
    the other. ``ready`` holds outputs that finished outside ``step`` (none here;
    chapter 15's overlapped loop has some)."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.ready: list[RequestOutput] = []

    def in_flight(self) -> bool:
        """Whether work is under way that the scheduler's queues do not show."""
        return bool(self.ready)

    def ready_ids(self) -> set[str]:
        """The ids of the finished requests that ``step`` has not returned yet."""
        return {output.request_id for output in self.ready}

    def settle(self) -> None:
        """Complete the work in flight, so that the engine is synchronous (no-op here)."""

    def step(self) -> list[RequestOutput]:
        """Schedule, run the model once (twice when prefills and decodes mix), sample,
        commit. Returns the requests that finished in this step."""
        engine = self.engine
        t0 = time.perf_counter()
        out = engine.scheduler.schedule()
        t1 = time.perf_counter()
        if out.is_empty:
            if engine.scheduler.has_unfinished():
                raise EngineError("the scheduler found nothing to run although requests "
                                  + "are waiting: the cache is too small for any of them")
            return []
        picks = engine.run(out, engine.runner.sample)
        t2 = time.perf_counter()
        sampled, forks = {}, []
        for (seq, child), token, _ in picks:
            if child is None:
                sampled[seq.seq_id] = token
            else:
                forks.append((seq, child, token))
        for parent, child, _ in forks:
            engine.requests[parent.request_id].seqs.append(child)
        done = engine.scheduler.commit(out, sampled, engine.eos_token_id, forks)
        engine.output_processor.record_logprobs(picks)
        done += self.stop_on_text([child or seq for (seq, child), _, _ in picks])
        engine.account(out, len(picks), t1 - t0 + time.perf_counter() - t2, t2 - t1)
        return engine.finish(done)

    # %% chapters/12_engine.md § Text out
    def stop_on_text(self, seqs: list[Sequence]) -> list[Sequence]:
        """Finish the sequences whose text holds a stop string; returns those that were still
        running (one already finished, at its length limit, is relabelled)."""
        done = []
        for seq in self.engine.output_processor.text_stops(seqs):
            if not seq.status.finished:
                self.engine.scheduler.abort(seq.seq_id)  # frees its blocks now
                done.append(seq)
            seq.status = SequenceStatus.FINISHED_STOPPED
        return done


# %% chapters/12_engine.md § One step
def _never(model, cache) -> bool:
    return False


@dataclass(frozen=True)
class EngineParts:
    """The parts an engine is assembled from. This chapter gives every default; later
    chapters contribute better ones (chapter 13 a cache format, chapter 14 a fused
    model and a one-kernel sampler, chapter 15 a prefill part for that model and a
    scheduler and step loop that overlap host and GPU).

    ``cache_formats``: ``kv_cache_dtype`` name -> ``CacheFormat``. ``prepare_model``:
    the paged model -> the model the engine runs. ``sampler(device)``, ``scheduler(manager,
    config)`` and ``step_loop(engine)`` build those parts. ``single_forward(model, cache)``:
    whether a step's prefills and decodes may share one forward.
    """

    cache_formats: Mapping[str, CacheFormat] = field(
        default_factory=lambda: {"auto": MODEL_DTYPE_CACHE})
    prepare_model: Callable = lambda model: model
    sampler: Callable[..., Sampler] = Sampler
    scheduler: Callable[..., Scheduler] = Scheduler
    step_loop: Callable[..., StepLoop] = StepLoop
    single_forward: Callable[..., bool] = _never

    def with_cache_format(self, name: str, cache_format: CacheFormat) -> EngineParts:
        """These parts with one more ``kv_cache_dtype``."""
        return replace(self, cache_formats={**self.cache_formats, name: cache_format})


# %% chapters/12_engine.md § Text out
class OutputProcessor:
    """What a user reads of the engine's requests: each sequence's text (an incremental
    detokenizer, made on first use), the stop strings found in it, its stop reason and
    its log-probabilities. ``requests`` is the engine's table of unfinished requests."""

    def __init__(self, tokenizer, eos_token_ids: tuple[int, ...],
                 requests: dict[str, _Request]) -> None:
        self.tokenizer, self.eos_token_ids, self.requests = tokenizer, eos_token_ids, requests

    def text(self, request: _Request, seq: Sequence) -> IncrementalDetokenizer | None:
        """The detokenizer of ``seq``, fed every token known so far (None: no tokenizer).
        A negative id is a token still on the GPU (chapter 15): it and what follows wait."""
        if self.tokenizer is None:
            return None
        text = request.texts.get(seq.sample_index)
        if text is None:
            params = request.params
            text = request.texts[seq.sample_index] = IncrementalDetokenizer(
                self.tokenizer, params.stop, params.include_stop_str_in_output)
        tokens, end = seq.output_token_ids, len(seq.output_token_ids)
        while end > text.num_tokens and tokens[end - 1] < 0:
            end -= 1
        if end > text.num_tokens:
            text.push(tokens[text.num_tokens:end])
        if seq.status.finished and end == len(tokens):
            text.finish()
        return text

    def text_stops(self, seqs: list[Sequence]) -> list[Sequence]:
        """Those of ``seqs`` with stop strings whose text now holds one (and that no stop
        string finished yet): the step loop finishes them."""
        hits = []
        for seq in seqs:
            request = self.requests.get(seq.request_id) if seq.params.stop else None
            if request is None or seq.status is SequenceStatus.FINISHED_STOPPED:
                continue
            if self.text(request, seq).stop_reason is not None:
                hits.append(seq)
        return hits

    def record_logprobs(self, picks: list) -> None:
        """Append the log-probabilities of a committed step's samples to their requests."""
        for (seq, child), _, entry in picks:
            if entry is not None:
                seq = child or seq
                request, index = self.requests[seq.request_id], seq.sample_index
                request.logprobs.setdefault(index, []).append(entry[1])
                total = request.cumulative_logprob.get(index, 0.0)
                request.cumulative_logprob[index] = total + entry[0]

    # %% chapters/12_engine.md § Text out
    def output(self, request: _Request, since: dict | None = None) -> RequestOutput:
        """The request's ``RequestOutput``: its completions, in sample order, and metrics.
        ``since`` maps a sample index to the tokens and characters already read: each of
        those completions then holds only what came after (``completion``)."""
        since = since or {}
        outputs = [self.completion(request, seq, *since.get(seq.sample_index, (0, 0)))
                   for seq in sorted(request.seqs, key=lambda s: s.sample_index)]
        first = request.seqs[0] if request.seqs else None
        metrics = {} if first is None else {
            "arrival_time": first.arrival_time, "first_token_time": first.first_token_time,
            "finish_time": max(s.finish_time or 0 for s in request.seqs),
            "num_preemptions": sum(s.num_preemptions for s in request.seqs),
            "num_cached_tokens": first.num_cached_prompt_tokens}
        return RequestOutput(request.request_id, request.prompt, request.prompt_token_ids,
                             outputs, request.finished, request.error, metrics)

    def completion(self, request: _Request, seq: Sequence, from_token: int = 0,
                   from_char: int = 0) -> CompletionOutput:
        """``seq``'s output: its known tokens, text, finish and stop reasons, logprobs; only
        those after the first ``from_token`` tokens and ``from_char`` characters, so that a
        stream pays for its new tokens each step, not for its whole length."""
        text = self.text(request, seq)
        tokens = [t for t in seq.output_token_ids[from_token:] if t >= 0]  # none on the GPU
        arrived = min(seq.output_token_ids[-2:], default=0) >= 0  # its finish is known then
        index = seq.sample_index
        logprobs = request.logprobs.get(index, []) if request.params.logprobs is not None else None
        return CompletionOutput(
            index, tokens, None if text is None else text.text[from_char:],
            seq.finish_reason if arrived else None,
            self.stop_reason(seq, seq.output_token_ids, text),
            request.cumulative_logprob.get(index),
            None if logprobs is None else logprobs[from_token:from_token + len(tokens)])

    def stop_reason(self, seq: Sequence, tokens: list[int],
                    text: IncrementalDetokenizer | None) -> str | int | None:
        """The stop string or stop token id that finished ``seq`` (None: EOS, or none)."""
        if seq.finish_reason != "stop":
            return None
        if text is not None and text.stop_reason is not None:
            return text.stop_reason
        last = tokens[-1] if tokens else None
        if last in self.eos_token_ids:
            return None
        return last if last in seq.params.stop_token_ids else None


# %% chapters/12_engine.md § Text out
def _request_id(request_id: str | None, engine: LLMEngine) -> str:
    """``request_id`` checked (a string that no request of ``engine`` not yet returned
    holds), or the next free id of its counter."""
    taken, counter = engine.requests.keys() | engine.loop.ready_ids(), engine._request_ids
    if request_id is None:
        request_id = str(next(counter))
        while request_id in taken:  # a caller chose this one
            request_id = str(next(counter))
        return request_id
    if not isinstance(request_id, str):
        raise InvalidRequestError("request_id must be a string, got "
                                  + f"{type(request_id).__name__} {request_id!r}")
    if request_id in taken:
        raise InvalidRequestError(f"request_id {request_id!r} belongs to an unfinished "
                                  + "request: choose another, or abort that one first")
    return request_id


# %% chapters/12_engine.md § Text out
def completion_tail(completion: CompletionOutput, from_token: int,
                    from_char: int) -> CompletionOutput:
    """``completion`` without its first ``from_token`` tokens and ``from_char`` characters."""
    logprobs = completion.logprobs
    return replace(completion, token_ids=completion.token_ids[from_token:],
                   text=None if completion.text is None else completion.text[from_char:],
                   logprobs=None if logprobs is None else logprobs[from_token:])


# %% chapters/12_engine.md § Beam search on fork and copy-on-write
@dataclass
class BeamSearchOutput:
    """``LLM.beam_search`` per prompt: the ``beam_width`` best continuations, best
    first, with their summed log-probabilities, and how many copy-on-write block copies
    separating the beams took."""

    prompt_token_ids: list[int]
    sequences: list[list[int]]
    cumulative_logprobs: list[float]
    num_cow_copies: int


def _beam_log_probs(logits: torch.Tensor, rows) -> tuple[torch.Tensor, list]:
    """Every row's next-token log-probabilities, and the sequence of each row (a beam
    step samples nothing)."""
    return logits.float().log_softmax(-1), [seq for seq, _ in rows]


# %% chapters/12_engine.md § Beam search on fork and copy-on-write
def _next_beams(scheduler: Scheduler, seq_ids, out: SchedulerOutput, beams, chosen,
                logprobs: torch.Tensor):
    """Commit a beam step: each chosen beam gets its token, a beam chosen again forks (a
    new sequence from ``seq_ids`` shares its blocks), the beams not chosen are freed."""
    taken, result, forks, sampled = set(), [], [], {}
    for parent, token, score in chosen:
        seq = beams[parent][0]
        if parent in taken:  # a second continuation of the same beam
            child = Sequence(next(seq_ids), -1, seq.prompt_token_ids, seq.params,
                             output_token_ids=list(seq.output_token_ids))
            forks.append((seq, child, token))
            seq = child
        else:
            sampled[seq.seq_id] = token
        taken.add(parent)
        result.append((seq, score))
    dropped = [i for i in range(len(beams)) if i not in taken]
    if dropped:  # every beam records a token: its best one, for those dropped next
        best = logprobs[dropped].argmax(-1).tolist()
        sampled.update((beams[i][0].seq_id, t) for i, t in zip(dropped, best))
    scheduler.commit(out, sampled, forks=forks)
    for i in dropped:
        if not beams[i][0].status.finished:
            scheduler.abort(beams[i][0].seq_id)
    return result
