"""Chapter 11 exercises: one step (sampling, a decode roofline, a timeline, speculative decoding).

Replace each `raise NotImplementedError(...)` with your answer, then run `make check-exercises`.
"""

from collections.abc import Callable, Hashable, Mapping

from minipaged.memory.block_manager import StepReservation
from minipaged.memory.sharing import SharingBlockManager


def check_top_p(keep) -> None:
    """Exercise 11.1: return for a correct ``keep(probs, top_p) -> set of token ids`` (top-p's
    rule: a token stays while the mass ranked before it is below ``top_p``); raise
    AssertionError for a wrong one."""
    raise NotImplementedError("Exercise 11.1: write assertions that a wrong top-p "
                              "fails (edit exercises/ch11_model_runner.py, check_top_p)")


def roofline_predictions() -> dict[str, float]:
    """Exercise 11.2: your predictions of the decode roofline, in output tokens per second
    (``"batch 1"``, ``"batch 256"``, ``"batch 256 at context 1,600"``), and the smallest batch
    at which a step reads more KV bytes than weight bytes (``"KV outweighs weights"``)."""
    raise NotImplementedError("Exercise 11.2: predict the decode roofline "
                              "(edit exercises/ch11_model_runner.py, roofline_predictions)")


def latency_predictions() -> dict[str, dict[str, tuple[float, float]]]:
    """Exercise 11.3: ``{policy: {request: (TTFT ms, TPOT ms)}}`` for the policies
    ``"prefill first"`` and ``"mixed"`` and the requests ``"A"``, ``"B"``, ``"C"``."""
    raise NotImplementedError("Exercise 11.3: predict the two latencies of each request "
                              "(edit exercises/ch11_model_runner.py, latency_predictions)")


class SpeculativeBlockManager(SharingBlockManager):
    """Exercise 11.4: chapter 5's manager, able to give back the tail of a sequence."""

    def roll_back_tokens(self, seq_id: Hashable, num_tokens: int) -> None:
        """Forget the last ``num_tokens`` tokens of ``seq_id`` (no step pending): its length
        drops, the blocks past its new end leave its table, and a block no other table holds
        goes back to the free list."""
        raise NotImplementedError("Exercise 11.4: give back a sequence's tail "
                                  "(edit exercises/ch11_model_runner.py, "
                                  "SpeculativeBlockManager.roll_back_tokens)")


def speculative_step(manager: SpeculativeBlockManager, drafts: Mapping[Hashable, int],
                     verify: Callable[[StepReservation], Mapping[Hashable, int]]
                     ) -> dict[Hashable, list[int]]:
    """Exercise 11.4: one verification step of speculative decoding.

    Reserve ``drafts[s] + 1`` slots for every sequence ``s`` (its pending token and its
    ``drafts[s]`` draft tokens), call ``verify(reservation)`` (the forward: it writes K/V into
    the reservation's slots and returns how many drafts of each sequence it accepted), keep the
    pending token and the accepted drafts, and give back the rest. Returns each sequence's kept
    slots, in order. If ``verify`` raises, the manager is as before and the error propagates.
    """
    raise NotImplementedError("Exercise 11.4: reserve, verify, keep the accepted tokens, roll "
                              "back the rest (edit exercises/ch11_model_runner.py, speculative_step)")
