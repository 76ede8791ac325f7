"""Chapter 1 exercises: how big is the KV cache?

Replace each `raise NotImplementedError(...)` with your answer, then run `make check-exercises`.
"""


def block_bytes_all_layers(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int,
                           block_size: int) -> int:
    """Exercise 1.1: bytes of one physical block (block_size tokens) across all layers."""
    raise NotImplementedError("Exercise 1.1: return the bytes of one block across all layers "
                              "(edit exercises/ch01_kv_sizing.py, block_bytes_all_layers)")


def max_blocks(budget_bytes: int, num_layers: int, num_kv_heads: int, head_dim: int,
               dtype_bytes: int, block_size: int) -> int:
    """Exercise 1.2: how many whole blocks fit in budget_bytes."""
    raise NotImplementedError("Exercise 1.2: return how many whole blocks fit in the budget "
                              "(edit exercises/ch01_kv_sizing.py, max_blocks)")


def max_concurrent_requests(budget_bytes: int, bytes_per_token: int, context_len: int,
                            block_size: int) -> int:
    """Exercise 1.3: how many requests of context_len tokens fit, each given whole blocks."""
    raise NotImplementedError("Exercise 1.3: return how many requests fit in the budget "
                              "(edit exercises/ch01_kv_sizing.py, max_concurrent_requests)")


def audit_sizer(sizer) -> None:
    """Exercise 1.4: check a capacity planner's ``sizer(config) -> KV bytes per token``.

    Call ``sizer`` on transformers configs you choose and ``assert`` its answers: a correct
    sizer must pass, a sizer with a mistake must make one of your assertions fail.
    """
    raise NotImplementedError("Exercise 1.4: probe sizer with configs you choose and assert its "
                              "answers (edit exercises/ch01_kv_sizing.py, audit_sizer)")
