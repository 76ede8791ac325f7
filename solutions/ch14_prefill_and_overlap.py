"""Chapter 14 reference solutions."""


def query_tiles(query_lens: list[int], block_m: int) -> list[tuple[int, int]]:
    return [(seq, start) for seq, q_len in enumerate(query_lens)
            for start in range(0, q_len, block_m)]     # a partial last tile; none for q_len 0


def plannable(running: list[tuple[int, int, int]], num_waiting: int, num_swapped: int,
              free_blocks: int, max_num_seqs: int, max_num_batched_tokens: int) -> bool:
    if not running or num_swapped or len(running) > max_num_batched_tokens:
        return False  # nothing to decode, a swap-in comes first, or not all fit the budget
    if num_waiting and len(running) < max_num_seqs:
        return False  # a waiting request may be admitted: a prefill
    if free_blocks < len(running):
        return False  # someone may need a block that is not there: a preemption
    return all(outputs > 0 and prompt + outputs - computed == 1
               for prompt, outputs, computed in running)
