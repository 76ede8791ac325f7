"""Checks for the chapter 1 exercises (exercises/ch01_kv_sizing.py)."""

import pytest

from minipaged.sizing import kv_bytes_per_token_from_config, kv_shape_from_config
from tests.exercises.answers import load

ex = load("ch01_kv_sizing")
GiB = 1 << 30


def test_1_1_block_bytes():
    assert ex.block_bytes_all_layers(32, 8, 128, 2, 16) == 2 * 1024 * 1024  # the worked example
    assert ex.block_bytes_all_layers(80, 8, 128, 2, 32) == 32 * 320 * 1024
    assert ex.block_bytes_all_layers(28, 8, 128, 1, 1) == 57344


def test_1_2_max_blocks():
    assert ex.max_blocks(20 * GiB, 32, 8, 128, 2, 16) == 10_240  # 10,240 blocks: the worked answer
    assert ex.max_blocks(20 * GiB - 1, 32, 8, 128, 2, 16) == 10_239  # whole blocks only
    assert ex.max_blocks(0, 32, 8, 128, 2, 16) == 0


def test_1_3_max_concurrent_requests():
    per_token = 128 * 1024
    assert ex.max_concurrent_requests(20 * GiB, per_token, 4000, 16) == 40
    assert ex.max_concurrent_requests(20 * GiB, per_token, 4000, 256) == 40
    assert ex.max_concurrent_requests(20 * GiB, per_token, 4097, 16) == 39
    assert ex.max_concurrent_requests(20 * GiB, per_token, 4097, 256) == 37


# Exercise 1.4: two correct sizers and five with a planted mistake.
def _fields(config):
    shape = kv_shape_from_config(config)
    return shape.num_layers, shape.num_kv_heads, shape.head_dim, shape.dtype_bytes, config


def written_out(config):
    """A correct sizer that reads the fields itself."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    dtype_bytes = {"float32": 4, "float16": 2, "bfloat16": 2}[str(config.dtype).split(".")[-1]]
    return 2 * config.num_hidden_layers * kv_heads * head_dim * dtype_bytes


def query_heads(config):
    layers, _, head_dim, b, config = _fields(config)
    return 2 * layers * config.num_attention_heads * head_dim * b


def keys_only(config):
    layers, kv_heads, head_dim, b, _ = _fields(config)
    return layers * kv_heads * head_dim * b


def derived_head_dim(config):
    layers, kv_heads, _, b, config = _fields(config)
    return 2 * layers * kv_heads * (config.hidden_size // config.num_attention_heads) * b


def always_two_bytes(config):
    layers, kv_heads, head_dim, _, _ = _fields(config)
    return 2 * layers * kv_heads * head_dim * 2


def hidden_size_rule(config):
    layers, _, _, b, config = _fields(config)
    return 2 * layers * config.hidden_size * b


@pytest.mark.parametrize("sizer", [kv_bytes_per_token_from_config, written_out])
def test_1_4_audit_passes_a_correct_sizer(sizer):
    ex.audit_sizer(sizer)


@pytest.mark.parametrize("buggy", [query_heads, keys_only, derived_head_dim, always_two_bytes,
                                   hidden_size_rule])
def test_1_4_audit_catches_a_planted_mistake(buggy):
    with pytest.raises(AssertionError):
        ex.audit_sizer(buggy)
