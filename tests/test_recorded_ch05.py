"""Numbers chapter 5's prose quotes, checked here rather than in hidden cells of the chapter."""

from minipaged.sizing import kv_bytes_per_token


def test_one_prompt_copy_is_250_mib():
    # 32 layers, 8 KV heads, head_dim 128, fp16, 2,000 tokens: the problem statement's figure.
    per_token = kv_bytes_per_token(num_layers=32, num_kv_heads=8, head_dim=128, dtype_bytes=2)
    assert per_token * 2000 == 250 * 2**20
