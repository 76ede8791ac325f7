"""Checks for the chapter 1 exercises (exercises/ch01_kv_sizing.py)."""

import pytest
import torch

from minipaged.memory.sizing import kv_bytes_per_token_from_config, kv_shape_from_config
from tests.exercises.answers import load

ex = load("ch01_kv_sizing")
GiB = 1 << 30


def _block_nbytes(num_layers=32, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16,
                  block_size=16, num_query_heads=32):
    """The bytes of one block, measured: K and V of every layer, as meta tensors (no memory)."""
    del num_query_heads                      # the cache stores K and V only
    return sum(torch.empty(block_size, num_kv_heads, head_dim, dtype=dtype,
                           device="meta").nbytes for _ in range(num_layers) for _kv in "KV")


def test_1_1_block_growth():
    base = _block_nbytes()
    measured = {"block_size_32": _block_nbytes(block_size=32) / base,
                "fp8": _block_nbytes(dtype=torch.float8_e4m3fn) / base,
                "mqa": _block_nbytes(num_kv_heads=1) / base,
                "query_heads_64": _block_nbytes(num_query_heads=64) / base,
                "layers_64": _block_nbytes(num_layers=64) / base}
    predicted = ex.block_growth()
    assert set(predicted) == set(measured), f"predict each of {sorted(measured)}"
    for key, factor in measured.items():
        assert predicted[key] == pytest.approx(factor), \
            f"{key}: you predicted {predicted[key]}, the block changes by {factor}"


# Exercise 1.2: correct block counters must pass the audit; ones with a planted mistake must not.
def _block(num_layers, num_kv_heads, head_dim, dtype_bytes, block_size):
    return block_size * 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


def counter_floor(budget, *shape):
    return budget // _block(*shape)


def counter_divmod(budget, *shape):
    whole, _ = divmod(budget, _block(*shape))
    return int(whole)


def counter_ceil(budget, *shape):
    return -(-budget // _block(*shape))


def counter_round(budget, *shape):
    return round(budget / _block(*shape))


def counter_true_division(budget, *shape):
    return budget / _block(*shape)


def counter_keys_only(budget, num_layers, num_kv_heads, head_dim, dtype_bytes, block_size):
    return budget // (block_size * num_layers * num_kv_heads * head_dim * dtype_bytes)


def counter_two_bytes(budget, num_layers, num_kv_heads, head_dim, dtype_bytes, block_size):
    return budget // _block(num_layers, num_kv_heads, head_dim, 2, block_size)


@pytest.mark.parametrize("counter", [counter_floor, counter_divmod])
def test_1_2_audit_passes_a_correct_counter(counter):
    ex.audit_max_blocks(counter)


@pytest.mark.parametrize("buggy", [counter_ceil, counter_round, counter_true_division,
                                   counter_keys_only, counter_two_bytes])
def test_1_2_audit_catches_a_planted_mistake(buggy):
    with pytest.raises(AssertionError):
        ex.audit_max_blocks(buggy)


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
