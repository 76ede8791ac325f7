# GENERATED from chapters/15_prefill_and_overlap.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/15_prefill_and_overlap.md § The assembled engine: minipaged.LLM
"""``minipaged.LLM``: vLLM's offline API on the fastest engine the book builds.

The engine is chapter 12's ``LLMEngine``; this module only chooses its parts: chapter
13's FP8 cache format beside chapter 7's, chapter 14's fused model with chapter 15's paged
prefill kernel as its prefill part, chapter 14's one-kernel sampler, and chapter 15's
overlap scheduler and overlapped step loop. With the PyTorch attention backend
(a CPU) the model and sampler are chapter 9's and chapter 11's, whose PyTorch code is
fast there, where the fused Triton kernels would only be interpreted.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import torch

from minipaged.engine.fused_sampler import FusedSampler
from minipaged.engine.llm_engine import (MODEL_DTYPE_CACHE, BeamSearchOutput, CacheFormat,
                                         EngineParts, LLMEngine, RequestOutput, StepLoop,
                                         resolve_attention_backend)
from minipaged.engine.overlap_scheduler import OverlapScheduler, OverlapStepLoop
from minipaged.kernels.fp8_kv_cache import fp8_block_bytes, new_fp8_cache
from minipaged.kernels.prefill_attention import plan_paged_prefill, serves_mixed_batches
from minipaged.model.fast_qwen3 import as_fast_model
from minipaged.runtime import default_device
from minipaged.engine.sampler import Sampler
from minipaged.engine.scheduler import SamplingParams

__all__ = ["FAST_PARTS", "TORCH_PARTS", "LLM"]

FAST_PARTS = EngineParts(
    cache_formats={"auto": MODEL_DTYPE_CACHE,
                   "fp8": CacheFormat(new_fp8_cache, fp8_block_bytes, backends=("triton",))},
    prepare_model=partial(as_fast_model, plan_prefill=plan_paged_prefill),
    sampler=FusedSampler, scheduler=OverlapScheduler, step_loop=OverlapStepLoop,
    single_forward=serves_mixed_batches)
"""The best part of every kind the book builds."""

TORCH_PARTS = replace(FAST_PARTS, prepare_model=lambda model: model, sampler=Sampler,
                      single_forward=EngineParts().single_forward)
"""The parts for the PyTorch attention backend: chapter 9's model, chapter 11's sampler."""


def _engine_device(model, device) -> torch.device:
    """The device the engine will run ``model`` on (as chapter 12's loader places it)."""
    if device is not None:
        return torch.device(device)
    if isinstance(model, torch.nn.Module):
        return model.device
    return default_device()


# %% chapters/15_prefill_and_overlap.md § The assembled engine: minipaged.LLM
class LLM:
    """Offline generation on a paged KV cache, with vLLM's ``LLM`` API.

    ``model``: a transformers ``Qwen3ForCausalLM`` (weights shared, not copied), a
    ``Qwen3PagedModel``, or a hub id / local path. ``kv_cache_dtype``: ``"auto"`` (the
    model's dtype) or ``"fp8"`` (e4m3 with per-slot scales, chapter 13).
    ``overlap_scheduling``: plan each plain decode step while the GPU runs the previous
    one (chapter 15). ``num_blocks=None`` sizes the cache from ``gpu_memory_utilization``
    of the GPU's memory (a small default on CPU). ``attention_backend``: ``"auto"``
    (Triton kernels on a GPU, PyTorch on a CPU), ``"triton"`` or ``"torch"`` (chapter
    11). The other options are vLLM's, with
    its meaning; ``check_invariants`` checks the block manager after every step.
    ``llm_engine`` is the ``LLMEngine`` underneath, for a loop of ``add_request`` and
    ``step``. ``dtype``: the weights' dtype, ``"auto"`` (the model's own),
    ``"float32"``, ``"bfloat16"``, ``"float16"`` or a ``torch.dtype``; another than the
    model's converts the engine's copy of the weights (``ValueError`` for anything else).
    """

    def __init__(self, model, *, tokenizer=None,
                 dtype: str | torch.dtype = "auto",
                 device: torch.device | str | None = None,
                 block_size: int = 16, num_blocks: int | None = None,
                 max_num_seqs: int = 256, max_num_batched_tokens: int = 8192,
                 max_model_len: int | None = None, enable_prefix_caching: bool = True,
                 enable_chunked_prefill: bool = True, kv_cache_dtype: str = "auto",
                 overlap_scheduling: bool = True, gpu_memory_utilization: float = 0.9,
                 policy: str = "decode_first", preemption_mode: str = "recompute",
                 num_cpu_blocks: int | None = None, enable_cuda_graphs: bool | None = None,
                 check_invariants: bool = False, attention_backend: str = "auto") -> None:
        formats = FAST_PARTS.cache_formats
        backend = resolve_attention_backend(
            attention_backend, _engine_device(model, device),
            formats[kv_cache_dtype].backends if kv_cache_dtype in formats else ())
        parts = FAST_PARTS if backend == "triton" else TORCH_PARTS
        parts = parts if overlap_scheduling else replace(parts, step_loop=StepLoop)
        self.llm_engine = LLMEngine(
            model, parts=parts, tokenizer=tokenizer, dtype=dtype, device=device,
            block_size=block_size,
            num_blocks=num_blocks, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
            enable_prefix_caching=enable_prefix_caching,
            enable_chunked_prefill=enable_chunked_prefill, kv_cache_dtype=kv_cache_dtype,
            gpu_memory_utilization=gpu_memory_utilization, policy=policy,
            preemption_mode=preemption_mode, num_cpu_blocks=num_cpu_blocks,
            enable_cuda_graphs=enable_cuda_graphs, check_invariants=check_invariants,
            attention_backend=backend)

    # %% chapters/15_prefill_and_overlap.md § The assembled engine: minipaged.LLM
    def generate(self, prompts,
                 sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """One ``RequestOutput`` per prompt (token ids, or text with a tokenizer), in
        prompt order; a prompt that can never be served comes back with ``error`` set."""
        return self.llm_engine.generate(prompts, sampling_params, use_tqdm)

    def beam_search(self, prompts, beam_width: int,
                    max_tokens: int) -> list[BeamSearchOutput]:
        """The ``beam_width`` best continuations of each prompt (an idle engine only)."""
        return self.llm_engine.beam_search(prompts, beam_width, max_tokens)

    def chat(self, messages, sampling_params: SamplingParams | list[SamplingParams] | None
             = None, use_tqdm: bool = True, *,
             chat_template_kwargs: dict | None = None) -> list[RequestOutput]:
        """Answer one conversation (a list of ``{"role", "content"}`` dicts) or a list of
        them: each is rendered by the tokenizer's chat template with the assistant's turn
        opened (``add_generation_prompt=True``), then generated for; ``prompt`` of each
        output is the rendered text. ``chat_template_kwargs`` go to the template."""
        texts = _chat_prompts(self.tokenizer, messages, chat_template_kwargs)
        # the template writes its special tokens itself: none added when tokenizing
        ids = [list(self.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
        outputs = self.llm_engine.generate(ids, sampling_params, use_tqdm)
        for output, text in zip(outputs, texts):
            output.prompt = text
        return outputs

    # %% chapters/15_prefill_and_overlap.md § The assembled engine: minipaged.LLM
    def add_request(self, prompt, params: SamplingParams | None = None,
                    request_id: str | None = None) -> str:
        """Queue one prompt; returns its request id, ``request_id`` if given (nothing is
        queued on an error, a duplicate of an unfinished request's id included)."""
        return self.llm_engine.add_request(prompt, params, request_id)

    def request_output(self, request_id: str, since: dict | None = None) -> RequestOutput:
        """The output so far of a request ``step`` has not returned yet (to stream); with
        ``since`` (sample index -> tokens and characters already read), only what is new."""
        return self.llm_engine.request_output(request_id, since)

    def step(self) -> list[RequestOutput]:
        """One engine step; the requests that finished in it."""
        return self.llm_engine.step()

    def abort_request(self, request_id: str) -> RequestOutput:
        """Cancel a request now (its blocks are freed); its output so far."""
        return self.llm_engine.abort_request(request_id)

    def has_unfinished_requests(self) -> bool:
        """Whether any added request is still waiting, running or in flight."""
        return self.llm_engine.has_unfinished_requests()

    def last_run_stats(self) -> dict:
        """The counters of the last ``generate`` call (steps, tokens, hit rate, ...)."""
        return self.llm_engine.last_run_stats()

    # %% chapters/15_prefill_and_overlap.md § The assembled engine: minipaged.LLM
    @property
    def model(self):
        """The model the engine runs (chapter 14's ``FastQwen3Model``, prefilling with
        chapter 15's paged kernel; chapter 9's model
        with the PyTorch attention backend)."""
        return self.llm_engine.model

    @property
    def tokenizer(self):
        return self.llm_engine.tokenizer

    @property
    def cache(self):
        """The paged KV cache (``PagedKVCache`` or ``Fp8PagedKVCache``)."""
        return self.llm_engine.cache

    @property
    def manager(self):
        """The block manager (chapter 6's, with sharing and prefix caching)."""
        return self.llm_engine.manager

    @property
    def scheduler(self):
        return self.llm_engine.scheduler

    @property
    def stats(self):
        """The counters of the current ``generate`` call (a ``RunStats``)."""
        return self.llm_engine.stats

    @property
    def overlapped_steps(self) -> int:
        """Steps that were launched before the previous step's tokens were read."""
        return getattr(self.llm_engine.loop, "overlapped_steps", 0)


# %% chapters/15_prefill_and_overlap.md § The assembled engine: minipaged.LLM
def _chat_prompts(tokenizer, messages, chat_template_kwargs: dict | None) -> list[str]:
    """One conversation (a list of ``{"role", "content"}`` dicts) or a list of them, each
    rendered by ``tokenizer``'s chat template with the assistant's turn opened."""
    if tokenizer is None:
        raise ValueError("chat() needs a tokenizer: pass tokenizer= to LLM, or use "
                         "generate() with token ids")
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("the tokenizer has no chat template: set "
                         "tokenizer.chat_template, or use generate() with a prompt")
    one = isinstance(messages, (list, tuple)) and messages and isinstance(messages[0], dict)
    conversations = [messages] if one else list(messages)
    return [tokenizer.apply_chat_template(list(c), tokenize=False, add_generation_prompt=True,
                                          **(chat_template_kwargs or {}))
            for c in conversations]
