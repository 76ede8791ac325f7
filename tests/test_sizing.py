"""Unit tests of minipaged.memory.sizing beyond the chapter's own checks."""

import pytest
import torch

from minipaged.memory.sizing import (DTYPE_BYTES, block_bytes, block_table_entries,
                                     blocks_in_budget, format_bytes, kv_bytes_per_token,
                                     kv_bytes_per_token_from_config, kv_shape_from_config,
                                     reference_configs)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, None])
def test_rejects_non_positive_or_non_integer(bad):
    with pytest.raises(ValueError, match="num_kv_heads"):
        kv_bytes_per_token(32, bad, 128, 2)


def test_formula_is_linear_in_every_factor():
    base = kv_bytes_per_token(2, 3, 5, 7)
    assert base == 2 * 2 * 3 * 5 * 7
    assert kv_bytes_per_token(4, 3, 5, 7) == 2 * base
    assert kv_bytes_per_token(2, 3, 5, 14) == 2 * base


def test_config_reader_uses_kv_heads_and_config_dtype():
    configs = reference_configs()
    llama = configs["Llama-3.1-70B"]
    assert kv_bytes_per_token_from_config(llama) == 320 * 1024
    assert kv_bytes_per_token_from_config(llama, dtype_bytes=1) == 160 * 1024
    shape = kv_shape_from_config(configs["Qwen3-0.6B"])
    assert (shape.num_layers, shape.num_kv_heads, shape.head_dim) == (28, 8, 128)
    assert DTYPE_BYTES[torch.bfloat16] == 2


def test_head_dim_falls_back_to_hidden_over_heads():
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=512, num_attention_heads=8, num_key_value_heads=2,
                      num_hidden_layers=3)
    cfg.head_dim = None
    assert kv_shape_from_config(cfg, dtype_bytes=2).head_dim == 64


def test_blocks_and_table_entries():
    assert blocks_in_budget(10, 3) == 3
    with pytest.raises(ValueError):
        blocks_in_budget(-1, 3)
    assert block_table_entries(0, 16) == 0
    assert block_table_entries(16, 16) == 1 and block_table_entries(17, 16) == 2
    assert block_table_entries(2**60 + 1, 2**4) == 2**56 + 1     # exact for any size (no float)
    with pytest.raises(ValueError, match="num_tokens"):
        block_table_entries(-1, 16)


def test_block_bytes_is_tokens_times_per_token():
    assert block_bytes(131_072, 16) == 2 * 1024 * 1024          # 32/8/128/bf16 at block size 16
    with pytest.raises(ValueError, match="block_size"):
        block_bytes(131_072, 0)


@pytest.mark.parametrize("n,text", [(0, "0 B"), (1023, "1023 B"), (1024, "1 KiB"), (131_072, "128 KiB"),
                                    (640 << 20, "640 MiB"), (5 << 30, "5 GiB"), (1536 << 30, "1.5 TiB"),
                                    (4096 << 40, "4096 TiB")])
def test_format_bytes_binary_units(n, text):
    assert format_bytes(n) == text


@pytest.mark.parametrize("dtype,expected", [(None, 2), ("float32", 4), ("bfloat16", 2), ("fp8", 1),
                                            (torch.int8, 1), (torch.float64, 8), ("float64", 8)])
def test_config_dtype_sets_the_element_size(dtype, expected):
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=512, num_attention_heads=8, num_key_value_heads=2,
                      num_hidden_layers=3)
    cfg.dtype = dtype
    assert kv_shape_from_config(cfg).dtype_bytes == expected


def test_unknown_config_dtype_is_an_error_not_a_guess():
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=512, num_attention_heads=8, num_key_value_heads=2,
                      num_hidden_layers=3)
    cfg.dtype = "float7"
    with pytest.raises(ValueError, match="dtype_bytes"):
        kv_shape_from_config(cfg)
    assert kv_shape_from_config(cfg, dtype_bytes=1).dtype_bytes == 1


def test_reference_configs_stay_within_their_published_shapes():
    configs = reference_configs()
    assert set(configs) == {"Qwen3-0.6B", "Llama-3.1-8B", "Llama-3.1-70B"}
    for name in ("Llama-3.1-8B", "Llama-3.1-70B"):               # 128K context (Llama 3.1)
        assert configs[name].max_position_embeddings == 131072
    big = kv_shape_from_config(configs["Llama-3.1-70B"])
    assert (big.num_layers, big.num_kv_heads, big.head_dim, big.num_attention_heads) == (80, 8, 128, 64)
    assert kv_shape_from_config(configs["Llama-3.1-8B"]).bytes_per_token == 128 * 1024
