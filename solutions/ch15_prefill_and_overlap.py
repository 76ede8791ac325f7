"""Chapter 15 reference solutions."""


def query_tiles(query_lens: list[int], block_m: int) -> list[tuple[int, int]]:
    return [(seq, start) for seq, q_len in enumerate(query_lens)
            for start in range(0, q_len, block_m)]     # a partial last tile; none for q_len 0


def exposing_states() -> dict[str, dict]:
    """Exercise 15.2: for each wrong planner, a state on which it answers otherwise than the
    rule. Each state differs from a plain decode step of three sequences in one field."""
    decoding = [(10, 3, 12), (5, 1, 5), (40, 7, 46)]   # one uncomputed token, outputs > 0 each
    plain = dict(running=decoding, num_waiting=0, num_swapped=0, free_blocks=8,
                 max_num_seqs=8, max_num_batched_tokens=64)   # the rule plans it early
    return {
        "ignores_swapped": {**plain, "num_swapped": 1},        # a swap-in comes first
        "ignores_waiting": {**plain, "num_waiting": 1},        # a free seat: an admission
        "any_waiting_blocks": {**plain, "num_waiting": 5, "max_num_seqs": 3},  # no free seat
        "one_free_block": {**plain, "free_blocks": 2},          # three may each need a block
        "first_token_too": {**plain, "running": decoding + [(8, 0, 7)]},   # prompt's last token
        "outputs_mean_decoding": {**plain, "running": decoding + [(30, 2, 0)]},  # recomputed
        "ignores_budget": {**plain, "max_num_batched_tokens": 2},   # three decodes, room for two
    }
