"""Chapter 14 exercises: prefill in the batch, and the host off the critical path.

Replace each `raise NotImplementedError(...)` with your answer, then run `make check-exercises`.
"""


def query_tiles(query_lens: list[int], block_m: int) -> list[tuple[int, int]]:
    """Exercise 14.1: ``(sequence, first new token)`` of every query tile of ``block_m``
    tokens, sequence by sequence, as the paged prefill kernel's plan lists them."""
    raise NotImplementedError("Exercise 14.1: one tile per block_m new tokens of each sequence "
                              "(edit exercises/ch14_prefill_and_overlap.py, query_tiles)")


def plannable(running: list[tuple[int, int, int]], num_waiting: int, num_swapped: int,
              free_blocks: int, max_num_seqs: int, max_num_batched_tokens: int) -> bool:
    """Exercise 14.2: whether the next step is sure to be a plain decode step.

    ``running`` holds one ``(prompt tokens, output tokens, computed tokens)`` per running
    sequence; ``free_blocks`` is what the scheduler may still claim (after its watermark).
    """
    raise NotImplementedError("Exercise 14.2: return True only when nothing but one decode "
                              "token per running sequence can be scheduled "
                              "(edit exercises/ch14_prefill_and_overlap.py, plannable)")
