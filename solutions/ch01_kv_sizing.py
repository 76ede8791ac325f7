"""Chapter 1 reference solutions."""


def block_growth() -> dict[str, float]:
    # bytes = block_size * 2 * layers * kv_heads * head_dim * dtype_bytes: query heads are absent
    return {"block_size_32": 2, "fp8": 0.5, "mqa": 1 / 8, "query_heads_64": 1, "layers_64": 2}


def audit_max_blocks(max_blocks) -> None:
    """Boundaries and the factors of a block, with answers worked out by hand."""
    block = 16 * 2 * 32 * 8 * 128 * 2                       # 2 MiB: the chapter's worked block
    assert max_blocks(20 * 2**30, 32, 8, 128, 2, 16) == 10_240, "20 GiB / 2 MiB"
    assert max_blocks(20 * 2**30 - 1, 32, 8, 128, 2, 16) == 10_239, "whole blocks only: floor"
    assert max_blocks(block - 1, 32, 8, 128, 2, 16) == 0, "less than a block holds none"
    assert max_blocks(3 * block // 2, 32, 8, 128, 2, 16) == 1, "1.5 blocks: one, not two"
    assert type(max_blocks(block, 32, 8, 128, 2, 16)) is int, "a count of blocks is an int"
    assert max_blocks(2**30, 1, 1, 64, 4, 16) == 2**30 // (16 * 2 * 64 * 4), "K and V, fp32"


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
