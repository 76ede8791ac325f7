# GENERATED from chapters/01_kv_sizing.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/01_kv_sizing.md § The formula in code
"""KV-cache sizing: bytes per token, per request, per block, and what fits a budget."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "DTYPE_BYTES", "KVShape", "kv_bytes_per_token", "kv_shape_from_config",
    "kv_bytes_per_token_from_config", "block_bytes", "blocks_in_budget",
    "block_table_entries", "ceil_div", "parameter_count", "reference_configs",
    "format_bytes",
]

DTYPE_BYTES = {
    torch.float32: 4, torch.float16: 2, torch.bfloat16: 2, torch.float8_e4m3fn: 1,
    "float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1,
}


def _positive_int(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int,
                       dtype_bytes: int) -> int:
    """Bytes of K and V of one token across all layers: 2 * L * H_kv * D * b."""
    return (2 * _positive_int("num_layers", num_layers)
            * _positive_int("num_kv_heads", num_kv_heads)
            * _positive_int("head_dim", head_dim)
            * _positive_int("dtype_bytes", dtype_bytes))


def format_bytes(n: float) -> str:
    """Binary units, four significant digits: 131072 -> '128 KiB'."""
    unit = "B"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024:
            break
        n, unit = n / 1024, bigger
    return f"{n:.4g} {unit}"


# %% chapters/01_kv_sizing.md § Reading it off a model's config
@dataclass(frozen=True)
class KVShape:
    """What the KV cache of a model depends on."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    num_attention_heads: int
    dtype_bytes: int

    @property
    def bytes_per_token(self) -> int:
        """K and V bytes of one token across all layers."""
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim,
                                  self.dtype_bytes)

    @property
    def gqa_ratio(self) -> int:
        """Query heads per KV head: sizing with query heads overestimates this much."""
        return self.num_attention_heads // self.num_kv_heads


def _bytes_of_dtype(dtype: torch.dtype | str | None) -> int:
    """Bytes per element of a config's dtype; 2 (fp16/bf16) when it names none."""
    if dtype is None:
        return 2
    if isinstance(dtype, str):
        dtype = DTYPE_BYTES.get(dtype) or getattr(torch, dtype, None)
        if isinstance(dtype, int):
            return dtype
    if isinstance(dtype, torch.dtype):
        return dtype.itemsize
    raise ValueError(f"cannot tell how many bytes the dtype {dtype!r} takes: "
                     "pass dtype_bytes=")


def kv_shape_from_config(config, dtype_bytes: int | None = None) -> KVShape:
    """Read the KV shape from a transformers config (Llama, Qwen3, Mistral, ... fields).

    ``dtype_bytes`` defaults to the config's own dtype (``dtype`` or ``torch_dtype``),
    else 2.
    """
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    if dtype_bytes is None:
        dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        dtype_bytes = _bytes_of_dtype(dtype)
    return KVShape(config.num_hidden_layers, kv_heads, head_dim, heads, dtype_bytes)


def kv_bytes_per_token_from_config(config, dtype_bytes: int | None = None) -> int:
    """``kv_bytes_per_token`` for the model a transformers config describes."""
    return kv_shape_from_config(config, dtype_bytes).bytes_per_token


# %% chapters/01_kv_sizing.md § Reading it off a model's config
def reference_configs() -> dict:
    """Configs (no download) of the models this course sizes.

    Qwen3-0.6B, Llama-3.1-8B and Llama-3.1-70B: the fields that decide the KV cache
    and the parameter count (RoPE scaling is left out).
    """
    from transformers import LlamaConfig, Qwen3Config

    llama3 = dict(vocab_size=128256, max_position_embeddings=131072,
                  tie_word_embeddings=False, dtype="bfloat16")
    return {
        "Qwen3-0.6B": Qwen3Config(
            vocab_size=151936, hidden_size=1024, intermediate_size=3072,
            num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
            head_dim=128, tie_word_embeddings=True, max_position_embeddings=40960,
            dtype="bfloat16"),
        "Llama-3.1-8B": LlamaConfig(
            hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
            num_attention_heads=32, num_key_value_heads=8, **llama3),
        "Llama-3.1-70B": LlamaConfig(
            hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
            num_attention_heads=64, num_key_value_heads=8, **llama3),
    }


# %% chapters/01_kv_sizing.md § Against the weights
def parameter_count(config) -> int:
    """Exact parameter count of the model a config describes, allocating nothing."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


# %% chapters/01_kv_sizing.md § From tokens to blocks
def block_bytes(bytes_per_token: int, block_size: int) -> int:
    """Bytes of one cache block (``block_size`` tokens) across all layers."""
    return (_positive_int("bytes_per_token", bytes_per_token)
            * _positive_int("block_size", block_size))


def blocks_in_budget(budget_bytes: int, bytes_per_block: int) -> int:
    """How many whole blocks fit in a KV budget."""
    if budget_bytes < 0:
        raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
    return budget_bytes // _positive_int("bytes_per_block", bytes_per_block)


def ceil_div(numerator, denominator):
    """``ceil(numerator / denominator)`` in exact integers (ints or integer arrays).

    The one rounding-up of the course: blocks for a number of tokens, splits for a
    length.
    """
    return -(-numerator // denominator)


def block_table_entries(num_tokens: int, block_size: int) -> int:
    """Entries a block table needs: ceil(tokens / block_size), in exact integers."""
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
    return ceil_div(num_tokens, _positive_int("block_size", block_size))
