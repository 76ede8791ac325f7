"""Chapter 1 reference solutions."""


def block_bytes_all_layers(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int,
                           block_size: int) -> int:
    return block_size * 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


def max_blocks(budget_bytes: int, num_layers: int, num_kv_heads: int, head_dim: int,
               dtype_bytes: int, block_size: int) -> int:
    return budget_bytes // block_bytes_all_layers(num_layers, num_kv_heads, head_dim, dtype_bytes,
                                                  block_size)


def max_concurrent_requests(budget_bytes: int, bytes_per_token: int, context_len: int,
                            block_size: int) -> int:
    blocks = budget_bytes // (bytes_per_token * block_size)
    blocks_per_request = -(-context_len // block_size)
    return blocks // blocks_per_request


def audit_sizer(sizer) -> None:
    """Each probe exposes one kind of mistake; the expected numbers are worked out by hand."""
    from transformers import LlamaConfig, Qwen3Config

    # GQA (2 KV heads for 8 query heads): catches query heads, and hidden_size for H_kv * D.
    gqa = LlamaConfig(hidden_size=512, num_attention_heads=8, num_key_value_heads=2,
                      num_hidden_layers=3, dtype="float16")
    assert sizer(gqa) == 2 * 3 * 2 * 64 * 2, "GQA: size with KV heads, K and V"
    # Qwen3's shape: head_dim 128 although hidden_size / heads = 64.
    qwen = Qwen3Config(hidden_size=1024, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, num_hidden_layers=2, dtype="bfloat16")
    assert sizer(qwen) == 2 * 2 * 8 * 128 * 2, "use the config's own head_dim"
    # float32: 4 bytes per element, not 2.
    fp32 = LlamaConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=4,
                       num_hidden_layers=2, dtype="float32")
    assert sizer(fp32) == 2 * 2 * 4 * 64 * 4, "use the config's dtype"
