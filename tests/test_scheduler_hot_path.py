"""The scheduler's per-step shortcuts (chapter 10) decide exactly what the plain rules decide:
stop conditions checked through a cheap filter, the all-decode fast path, and the step statistics."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged.memory.block_manager import KVBlockManager
from minipaged.memory.prefix_cache import PrefixCachingBlockManager
from minipaged.engine.scheduler import SamplingParams, Scheduler, SchedulerConfig, Sequence, SequenceStatus


def reference_stop(seq, token, eos, config, num_blocks, block_size):
    """The stop rules, stated plainly (independent of the scheduler's code)."""
    params = seq.params
    if (not params.ignore_eos and eos is not None and token == eos) or token in params.stop_token_ids:
        return SequenceStatus.FINISHED_STOPPED
    n = seq.num_tokens
    if (len(seq.output_token_ids) >= params.max_tokens or n >= config.max_model_len
            or -(-(n + 1) // block_size) > num_blocks - config.watermark_blocks):
        return SequenceStatus.FINISHED_LENGTH
    return None


@settings(max_examples=60, deadline=None)
@given(data=st.data(), block_size=st.sampled_from([1, 2, 4]), num_blocks=st.integers(4, 24),
       watermark=st.integers(0, 2), max_model_len=st.integers(8, 60), num_seqs=st.integers(1, 4))
def test_stop_filter_matches_the_plain_rules(data, block_size, num_blocks, watermark, max_model_len,
                                             num_seqs):
    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=256, max_model_len=max_model_len,
                             watermark_blocks=watermark)
    scheduler = Scheduler(KVBlockManager(num_blocks, block_size), config)
    eos = data.draw(st.sampled_from([None, 3]))
    for i in range(num_seqs):
        params = SamplingParams(max_tokens=data.draw(st.integers(1, 40)),
                                ignore_eos=data.draw(st.booleans()),
                                stop_token_ids=tuple(data.draw(st.lists(st.integers(0, 5), max_size=2))))
        prompt = [1] * data.draw(st.integers(1, max_model_len))
        try:
            scheduler.add(Sequence(i, i, prompt, params))
        except ValueError:
            pass  # a prompt that can never run is refused; covered elsewhere
    for _ in range(200):
        if not scheduler.has_unfinished():
            break
        out = scheduler.schedule()
        sampled = {c.seq.seq_id: data.draw(st.integers(0, 12)) for c in out.chunks if c.samples}
        done = scheduler.commit(out, sampled, eos_token_id=eos)
        for chunk in out.chunks:
            seq = chunk.seq
            if seq.seq_id not in sampled or seq.status is SequenceStatus.WAITING:
                continue
            expected = reference_stop(seq, sampled[seq.seq_id], eos, config, num_blocks, block_size)
            assert (seq.status if seq.status.finished else None) == expected, (seq, expected)
            assert (seq in done) == (expected is not None)
        scheduler.check_invariants()
    assert not scheduler.has_unfinished()


@pytest.mark.parametrize("num_blocks", [400, 40])
def test_decode_fast_path_and_stats_match_the_slow_path(num_blocks, monkeypatch):
    """Steps planned through the all-decode shortcut equal those planned sequence by sequence,
    with room to spare (no counting) and on a tight cache (the manager counts, preemptions)."""
    planned = Scheduler._decode_step
    taken = []

    def run(fast):
        def decode_step(self, out, budget):
            taken.append(fast and planned(self, out, budget))
            return taken[-1]
        monkeypatch.setattr(Scheduler, "_decode_step", decode_step)
        manager = PrefixCachingBlockManager(num_blocks, 4)
        scheduler = Scheduler(manager, SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64,
                                                       max_model_len=256))
        for i in range(8):
            scheduler.add(Sequence(i, i, [i % 3] * (5 + 3 * i), SamplingParams(max_tokens=20 + i)))
        trace = []
        while scheduler.has_unfinished():
            out = scheduler.schedule()
            trace.append(([(c.seq.seq_id, c.start, c.num_tokens) for c in out.chunks],
                          [s.seq_id for s in out.preempted],
                          out.reservation.slot_mapping.tolist(),
                          (out.stats.num_prefill_tokens, out.stats.num_decode_tokens)))
            prefill = sum(c.num_tokens for c in out.chunks if c.is_prefill)
            assert trace[-1][3] == (prefill, out.num_tokens - prefill)
            scheduler.commit(out, {c.seq.seq_id: 7 for c in out.chunks if c.samples})
            scheduler.check_invariants()
        return trace

    fast = run(True)
    assert sum(taken) > 10  # the shortcut planned many steps
    slow = run(False)
    assert fast == slow and len(fast) > 20
    assert any(preempted for _, preempted, _, _ in fast) == (num_blocks == 40)
