"""Chapter 1 exercises: how big is the KV cache?

Replace each `raise NotImplementedError(...)` with your answer, then run `make check-exercises`.
"""


def block_growth() -> dict[str, float]:
    """Exercise 1.1: predict, before computing, by what factor one block's bytes change.

    Start from the 32-layer, 8-KV-head, head-dim-128, bf16 block of 16 tokens and change one
    thing at a time. Return a dict with a factor for each key: ``"block_size_32"`` (16 tokens
    to 32), ``"fp8"`` (bf16 to a 1-byte cache dtype), ``"mqa"`` (8 KV heads to 1),
    ``"query_heads_64"`` (32 query heads to 64, KV heads unchanged), ``"layers_64"``.
    """
    raise NotImplementedError("Exercise 1.1: write down your predicted factors, then check them "
                              "(edit exercises/ch01_kv_sizing.py, block_growth)")


def audit_max_blocks(max_blocks) -> None:
    """Exercise 1.2: test a block counter ``max_blocks(budget_bytes, num_layers, num_kv_heads,
    head_dim, dtype_bytes, block_size) -> int`` (how many whole blocks fit in the budget).

    Call it on budgets you choose and ``assert`` its answers: a correct counter must pass, one
    with a mistake must make one of your assertions fail.
    """
    raise NotImplementedError("Exercise 1.2: probe max_blocks with budgets you choose and assert "
                              "its answers (edit exercises/ch01_kv_sizing.py, audit_max_blocks)")


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
