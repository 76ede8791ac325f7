"""Chapter 15 exercises: prefill in the batch, and the host off the critical path.

Replace each `raise NotImplementedError(...)` with your answer, then run `make check-exercises`.
"""


def query_tiles(query_lens: list[int], block_m: int) -> list[tuple[int, int]]:
    """Exercise 15.1: ``(sequence, first new token)`` of every query tile of ``block_m``
    tokens, sequence by sequence, as the paged prefill kernel's plan lists them."""
    raise NotImplementedError("Exercise 15.1: one tile per block_m new tokens of each sequence "
                              "(edit exercises/ch15_prefill_and_overlap.py, query_tiles)")


def exposing_states() -> dict[str, dict]:
    """Exercise 15.2: for each wrong planner of the exercise ("ignores_swapped",
    "ignores_waiting", "any_waiting_blocks", "one_free_block", "first_token_too",
    "outputs_mean_decoding", "ignores_budget"), a scheduler state on which it answers
    otherwise than the chapter's rule: a dict with the keys ``running`` (one ``(prompt tokens,
    output tokens, computed tokens)`` per running sequence), ``num_waiting``, ``num_swapped``,
    ``free_blocks``, ``max_num_seqs`` and ``max_num_batched_tokens``."""
    raise NotImplementedError("Exercise 15.2: find a state that exposes each wrong planner "
                              "(edit exercises/ch15_prefill_and_overlap.py, exposing_states)")
