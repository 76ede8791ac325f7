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
