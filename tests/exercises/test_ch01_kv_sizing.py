"""Checks for the chapter 1 exercises (exercises/ch01_kv_sizing.py)."""

from tests.exercises.answers import load

ex = load("ch01_kv_sizing")
GiB = 1 << 30


def test_1_1_block_bytes():
    assert ex.block_bytes_all_layers(32, 8, 128, 2, 16) == 2 * 1024 * 1024  # 2 MiB: the course's worked example
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
