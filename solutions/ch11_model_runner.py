"""Chapter 11 exercises: reference solutions."""

from collections.abc import Callable, Hashable, Mapping

from minipaged.memory.block_manager import StepReservation
from minipaged.memory.sharing import SharingBlockManager
from minipaged.memory.block_table import blocks_needed


def check_top_p(keep) -> None:
    """Exercise 11.1: cases chosen so that each plausible slip changes the answer. The
    probabilities are sums of powers of two, so the masses compare exactly, and no two are
    equal, so the order is never a tie."""
    probs = [0.0625, 0.5, 0.1875, 0.25]            # ranked: 1, 3, 2, 0
    assert keep(probs, 0.7) == {1, 3}               # mass before 2 is 0.75: out
    assert keep(probs, 0.75) == {1, 3}              # "below", not "at or below"
    assert keep(probs, 0.76) == {1, 2, 3}           # the token that crosses top_p stays
    assert keep(probs, 0.3) == {1}                  # the most likely token always stays
    assert keep(probs, 1.0) == {0, 1, 2, 3}
    assert keep([0.5, 0.0625, 0.25, 0.1875], 0.7) == {0, 2}   # by rank, not by id
    assert keep([0.125, 0.25, 0.0625, 0.5, 0.046875, 0.015625], 0.9) == {0, 1, 2, 3}


def roofline_predictions() -> dict[str, float]:
    # A step reads the weights once and every cached token's K/V: 1.19 GB + batch x 800 x
    # 114,688 B at 4.29 TB/s, and yields one token per sequence.
    weights, per_token, bandwidth = 1.19e9, 114_688, 4.29e12

    def tokens_per_s(batch, context):
        return batch * bandwidth / (weights + batch * context * per_token)

    return {"batch 1": tokens_per_s(1, 800), "batch 256": tokens_per_s(256, 800),
            "batch 256 at context 1,600": tokens_per_s(256, 1600),
            "KV outweighs weights": 13}     # 1.19e9 / (800 x 114,688) = 12.97


def latency_predictions() -> dict[str, dict[str, tuple[float, float]]]:
    # Prefill first: A, B, C prefill at 0-40, 40-80, 80-120 (running requests wait), then
    # decode steps end at 130, ..., 170. Mixed: B's prefill rides with A's decode (40-80), C's
    # with A's and B's (80-120), then decodes.
    return {"prefill first": {"A": (40, 26), "B": (65, 18), "C": (75, 10)},
            "mixed": {"A": (40, 22), "B": (65, 16), "C": (75, 10)}}


class SpeculativeBlockManager(SharingBlockManager):
    """Exercise 11.4: chapter 5's manager, able to give back the tail of a sequence."""

    def roll_back_tokens(self, seq_id: Hashable, num_tokens: int) -> None:
        self._check_no_step(f"roll back {seq_id!r}")
        state = self._state(seq_id)
        if not 0 <= num_tokens <= state.length:
            raise ValueError(f"cannot roll back {num_tokens} of {state.length} tokens")
        state.length -= num_tokens
        keep = blocks_needed(state.length, self.block_size)
        dropped = state.block_table[keep:]
        del state.block_table[keep:]
        for block in reversed(dropped):
            self._drop_block(block, seq_id)        # frees it only if no other table holds it


def speculative_step(manager: SpeculativeBlockManager, drafts: Mapping[Hashable, int],
                     verify: Callable[[StepReservation], Mapping[Hashable, int]]
                     ) -> dict[Hashable, list[int]]:
    reservation = manager.reserve_step({s: k + 1 for s, k in drafts.items()})
    try:
        accepted = dict(verify(reservation))
        for s, k in drafts.items():
            if not 0 <= accepted[s] <= k:
                raise ValueError(f"{s!r}: {accepted[s]} of {k} drafts accepted")
    except BaseException:
        manager.end_step(reservation, ran=False)
        raise
    manager.end_step(reservation)
    slots, start = {}, 0
    for s, k in drafts.items():
        slots[s] = reservation.slot_mapping[start:start + accepted[s] + 1].tolist()
        start += k + 1
        manager.roll_back_tokens(s, k - accepted[s])
    return slots
