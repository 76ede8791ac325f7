"""The scheduler (chapter 10) on the real block manager, with a stand-in model (token 7 forever)."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged.memory.block_manager import KVBlockManager
from minipaged.memory.sharing import SharingBlockManager
from minipaged.engine.scheduler import (PromptTooLongError, SamplingParams, Scheduler,
                                        SchedulerConfig, SchedulerError, Sequence, SequenceStatus)


def make(num_blocks=24, block_size=4, manager_cls=KVBlockManager, **config):
    manager = manager_cls(num_blocks, block_size)
    settings_ = dict(max_num_seqs=8, max_num_batched_tokens=48, max_model_len=128)
    settings_.update(config)
    return manager, Scheduler(manager, SchedulerConfig(**settings_))


def add_workload(scheduler, num, seed, prompt=(1, 40), new=(1, 30)):
    rng = random.Random(seed)
    seqs = []
    for i in range(num):
        seq = Sequence(i, i, [rng.randrange(1000) for _ in range(rng.randint(*prompt))],
                       SamplingParams(max_tokens=rng.randint(*new)))
        scheduler.add(seq)
        seqs.append(seq)
    return seqs


def step(scheduler, token=7):
    out = scheduler.schedule()
    sampled = {c.seq.seq_id: token for c in out.chunks if c.samples}
    done = scheduler.commit(out, sampled)
    scheduler.check_invariants()
    return out, done


def run_to_end(scheduler, max_steps=5000):
    while scheduler.has_unfinished():
        out, _ = step(scheduler)
        assert out.chunks, "stalled"
        assert scheduler.step_count < max_steps


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), num_blocks=st.integers(12, 40), block_size=st.sampled_from([1, 2, 4, 8]),
       policy=st.sampled_from(["decode_first", "prefill_first"]), chunked=st.booleans(),
       budget=st.integers(8, 64), max_num_seqs=st.integers(1, 8))
def test_random_workloads_finish_without_leaks(seed, num_blocks, block_size, policy, chunked, budget,
                                                max_num_seqs):
    capacity = num_blocks * block_size
    manager, scheduler = make(num_blocks, block_size, policy=policy, enable_chunked_prefill=chunked,
                              max_num_batched_tokens=budget, max_num_seqs=max_num_seqs,
                              max_model_len=capacity)
    max_prompt = min(40, capacity - 1)
    seqs = add_workload(scheduler, 10, seed, prompt=(1, max_prompt), new=(1, 30))
    while scheduler.has_unfinished():
        out, _ = step(scheduler)
        assert out.chunks, "stalled"
        assert len(scheduler.running) <= max_num_seqs
        # the token budget holds, except one unchunked over-budget prompt (it may be a recompute)
        largest = max(c.num_tokens for c in out.chunks)
        assert out.num_tokens <= budget or (not chunked and out.num_tokens - largest < budget)
    assert manager.num_free_blocks == num_blocks and manager.num_sequences == 0
    for seq in seqs:
        assert seq.status.finished and seq.output_token_ids == [7] * len(seq.output_token_ids)
        if seq.status is SequenceStatus.FINISHED_LENGTH and len(seq.output_token_ids) < seq.params.max_tokens:
            # cut short only when one more token would not fit the model or the whole cache
            assert seq.num_tokens >= capacity - block_size


def test_token_budget_and_seat_limits_hold_every_step():
    manager, scheduler = make(num_blocks=64, max_num_batched_tokens=32, max_num_seqs=3,
                              enable_chunked_prefill=True)
    add_workload(scheduler, 8, seed=1)
    while scheduler.has_unfinished():
        out, _ = step(scheduler)
        assert out.num_tokens <= 32 and len(scheduler.running) <= 3


def test_preemption_happens_and_outputs_complete():
    manager, scheduler = make(num_blocks=20)   # 80 slots; one request needs up to 70
    seqs = add_workload(scheduler, 10, seed=0)
    run_to_end(scheduler)
    assert scheduler.total_preemptions > 0
    assert all(len(s.output_token_ids) == s.params.max_tokens for s in seqs)
    assert any(s.num_preemptions for s in seqs)


def test_decode_first_never_skips_a_running_sequence():
    manager, scheduler = make(num_blocks=200, max_num_seqs=6)
    add_workload(scheduler, 12, seed=5)
    while scheduler.has_unfinished():
        running = [s for s in scheduler.running if s.num_uncomputed_tokens == 1]
        out, _ = step(scheduler)
        scheduled = {id(c.seq) for c in out.chunks}
        assert all(id(s) in scheduled for s in running)


def test_prefill_first_runs_prefill_only_steps():
    manager, scheduler = make(num_blocks=200, policy="prefill_first")
    add_workload(scheduler, 3, seed=2)
    out, _ = step(scheduler)
    assert out.chunks and all(c.is_prefill for c in out.chunks)


def test_too_long_prompts_are_refused_and_change_nothing():
    manager, scheduler = make(num_blocks=8, max_model_len=64)
    add_workload(scheduler, 2, seed=0, prompt=(1, 10))
    before = (list(scheduler.waiting), manager.num_free_blocks)
    for n in (0, 64, 100, 40):  # 40 tokens need 11 blocks of 4 > 8
        with pytest.raises(PromptTooLongError):
            scheduler.add(Sequence(50 + n, 50, [1] * n, SamplingParams()))
    assert (list(scheduler.waiting), manager.num_free_blocks) == before
    with pytest.raises(SchedulerError):
        scheduler.add(Sequence(0, 0, [1], SamplingParams()))  # id already live
    run_to_end(scheduler)


def test_abort_from_every_queue_frees_everything():
    manager, scheduler = make(num_blocks=16, max_num_seqs=2)
    seqs = add_workload(scheduler, 5, seed=3, prompt=(5, 20), new=(10, 20))
    step(scheduler)
    step(scheduler)
    running, waiting = scheduler.running[0], scheduler.waiting[0]
    scheduler.abort(running.seq_id)
    scheduler.abort(waiting.seq_id)
    scheduler.check_invariants()
    assert running.seq_id not in manager and running.finish_reason == "abort"
    with pytest.raises(SchedulerError):
        scheduler.abort(running.seq_id)
    run_to_end(scheduler)
    assert manager.num_free_blocks == 16
    assert sum(s.status is SequenceStatus.FINISHED_ABORTED for s in seqs) == 2


def test_aborted_step_restores_the_manager():
    manager, scheduler = make(num_blocks=16)
    add_workload(scheduler, 3, seed=4)
    step(scheduler)
    tables = {s.seq_id: manager.block_table(s.seq_id) for s in scheduler.running}
    free = manager.num_free_blocks
    out = scheduler.schedule()
    scheduler.abort_step(out)
    assert manager.num_free_blocks == free and manager.invariants_ok()
    assert {s.seq_id: manager.block_table(s.seq_id) for s in scheduler.running} == tables
    retry = scheduler.schedule()
    assert [(c.seq.seq_id, c.start, c.num_tokens) for c in retry.chunks] == \
        [(c.seq.seq_id, c.start, c.num_tokens) for c in out.chunks]
    scheduler.commit(retry, {c.seq.seq_id: 7 for c in retry.chunks if c.samples})
    scheduler.check_invariants()


def test_stop_tokens_and_eos():
    manager, scheduler = make(num_blocks=32)
    a = Sequence(0, 0, [1, 2, 3], SamplingParams(max_tokens=10))
    b = Sequence(1, 1, [1, 2], SamplingParams(max_tokens=10, ignore_eos=True))
    c = Sequence(2, 2, [4], SamplingParams(max_tokens=10, stop_token_ids=(9,)))
    for s in (a, b, c):
        scheduler.add(s)
    out = scheduler.schedule()
    done = scheduler.commit(out, {0: 5, 1: 5, 2: 9}, eos_token_id=5)
    assert {s.seq_id for s in done} == {0, 2}
    assert a.finish_reason == "stop" and c.finish_reason == "stop" and b.status is SequenceStatus.RUNNING
    assert manager.num_sequences == 1


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), num_blocks=st.integers(16, 40), block_size=st.sampled_from([1, 2, 4]),
       mode=st.sampled_from(["recompute", "swap"]), policy=st.sampled_from(["decode_first", "prefill_first"]),
       chunked=st.booleans())
def test_prefix_caching_manager_with_shared_prompts(seed, num_blocks, block_size, mode, policy, chunked):
    from minipaged.memory.prefix_cache import PrefixCachingBlockManager

    manager = PrefixCachingBlockManager(num_blocks, block_size, num_cpu_blocks=num_blocks)
    capacity = num_blocks * block_size
    scheduler = Scheduler(manager, SchedulerConfig(
        max_num_seqs=4, max_num_batched_tokens=16, max_model_len=capacity, policy=policy,
        preemption_mode=mode, enable_chunked_prefill=chunked))
    rng = random.Random(seed)
    system = [rng.randrange(50) for _ in range(rng.randint(1, min(20, capacity // 2)))]
    seqs = []
    for i in range(8):
        prompt = system + [rng.randrange(50) for _ in range(rng.randint(0, 6))]
        seq = Sequence(i, i, prompt[:capacity - 1], SamplingParams(max_tokens=rng.randint(1, 12)))
        scheduler.add(seq)
        seqs.append(seq)
    while scheduler.has_unfinished():
        out, _ = step(scheduler, token=rng.randrange(50))
        assert out.chunks, "stalled"
        assert all(manager.token_ids(s.seq_id) == s.token_ids(0, s.num_tokens) for s in scheduler.running)
    assert manager.num_free_blocks == num_blocks and manager.num_free_cpu_blocks == num_blocks
    assert all(s.status.finished for s in seqs)
    assert manager.num_sequences == 0


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), watermark=st.integers(1, 3),
       mode=st.sampled_from(["recompute", "swap"]))
def test_copy_on_write_never_eats_into_the_watermark(seed, watermark, mode):
    """Forked sequences share a partly filled last block; the copy its next token needs is
    counted before the step is planned, so every step leaves the watermark free."""
    rng = random.Random(seed)
    manager, scheduler = make(24, 4, manager_cls=lambda n, b: SharingBlockManager(n, b, 32),
                              watermark_blocks=watermark, preemption_mode=mode, max_model_len=96)
    next_id = 0
    for next_id in range(6):
        scheduler.add(Sequence(next_id, next_id, [rng.randrange(50) for _ in range(rng.randint(1, 12))],
                               SamplingParams(max_tokens=rng.randint(5, 30))))
    for _ in range(300):
        if not scheduler.has_unfinished():
            break
        out = scheduler.schedule()
        assert manager.num_free_blocks >= watermark
        sampled = {c.seq.seq_id: 1 for c in out.chunks if c.samples}
        forks = []
        if sampled and rng.random() < 0.3 and len(scheduler.running) < 8:
            parent = next(c.seq for c in out.chunks if c.seq.seq_id in sampled)
            next_id += 1
            child = Sequence(next_id, parent.request_id, parent.prompt_token_ids, parent.params,
                             output_token_ids=list(parent.output_token_ids))
            forks.append((parent, child, 2))
        scheduler.commit(out, sampled, forks=forks)
        scheduler.check_invariants()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), num_blocks=st.integers(10, 24), block_size=st.sampled_from([1, 2, 4]),
       budget=st.integers(2, 8))
def test_a_prompt_swapped_out_mid_prefill_comes_back_in_chunks(seed, num_blocks, block_size, budget):
    """Chunked prefill under a small token budget, preemption by swap: a sequence parked in the
    middle of its prefill comes back for a chunk that fits the budget; nothing stalls."""
    capacity = num_blocks * block_size
    manager = SharingBlockManager(num_blocks, block_size, num_cpu_blocks=4 * num_blocks)
    scheduler = Scheduler(manager, SchedulerConfig(
        max_num_seqs=8, max_num_batched_tokens=budget, max_model_len=capacity,
        enable_chunked_prefill=True, preemption_mode="swap"))
    add_workload(scheduler, 8, seed, prompt=(1, min(20, capacity - 1)), new=(1, 12))
    run_to_end(scheduler)
    assert manager.num_free_blocks == num_blocks and manager.num_sequences == 0
