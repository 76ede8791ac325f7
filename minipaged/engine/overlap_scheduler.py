# GENERATED from chapters/15_prefill_and_overlap.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/15_prefill_and_overlap.md § Host work off the critical path
"""Host work off the critical path: a decode step planned while the GPU runs the one before.

``OverlapScheduler`` (chapter 10's scheduler) commits a plain decode step with placeholder
tokens (``UNRESOLVED``) and puts the sampled tokens in place one step later;
``OverlapStepLoop`` (chapter 12's step loop) launches each such step before the previous
step's tokens reach the host, and feeds them to it on the device.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from minipaged.engine.fused_sampler import to_device
from minipaged.engine.llm_engine import StepLoop
from minipaged.engine.scheduler import Scheduler, SchedulerOutput, Sequence, SequenceStatus

__all__ = ["UNRESOLVED", "OverlapScheduler", "InFlightStep", "OverlapStepLoop"]

UNRESOLVED = -1
"""The token a committed step holds until the token sampled on the GPU reaches the host."""


# %% chapters/15_prefill_and_overlap.md § Host work off the critical path
class OverlapScheduler(Scheduler):
    """Chapter 10's scheduler, able to commit a decode step before its tokens are known."""

    def next_is_decode(self) -> bool:
        """Whether the next ``schedule`` is sure to decode one token of every running
        sequence and do nothing else: no admission, swap-in or preemption."""
        running, config = self.running, self.config
        if (not running or self.swapped or len(running) > config.max_num_batched_tokens
                or (self.waiting and len(running) < config.max_num_seqs)
                or self._free_after(0) < len(running)):  # at most a new block each
            return False
        return all(s.output_token_ids  # Sequence.num_uncomputed_tokens == 1, written out
                   and len(s.prompt_token_ids) + len(s.output_token_ids)
                   - s.num_computed_tokens == 1 for s in running)

    def commit_unresolved(self, out: SchedulerOutput, stopped: dict) -> list[Sequence]:
        """Commit a decode step whose tokens are still on the GPU: each sequence gets
        ``UNRESOLVED``, except those in ``stopped`` (seq_id -> status), which finish.
        Returns the sequences that finished, ``max_tokens`` reached included."""
        self.manager.end_step(out.reservation)  # its tokens are told once resolved
        out.reservation = None
        now, done, limit = time.perf_counter(), [], self._length_limit
        for chunk in out.chunks:
            seq = chunk.seq
            status = stopped.get(seq.seq_id)
            if status is None:
                outputs = seq.output_token_ids
                seq.num_computed_tokens = chunk.start + 1
                outputs.append(UNRESOLVED)
                if (len(outputs) >= seq.params.max_tokens
                        or len(seq.prompt_token_ids) + len(outputs) >= limit):
                    status = SequenceStatus.FINISHED_LENGTH
            if status is not None:
                self._finish(seq, status, now)
                done.append(seq)
        if done:
            finished = set(done)
            self.running[:] = [s for s in self.running if s not in finished]
        return done

    # %% chapters/15_prefill_and_overlap.md § Host work off the critical path
    def resolve(self, seqs: list[Sequence], tokens: list[int], eos_token_id: int | None,
                keep_running: bool) -> tuple[dict, list[Sequence]]:
        """Put ``tokens`` in place of the placeholders that ``seqs`` end with.

        Returns ``(stopped, done)``: the running sequences a token stopped (seq_id ->
        status; left running if ``keep_running``, as they are in a launched step), and the
        sequences that are finished now and hold no placeholder any more.
        """
        now, stopped, done, told = time.perf_counter(), {}, [], {}
        for seq, token in zip(seqs, tokens):
            seq.output_token_ids[-1] = token
            if seq.status.finished:  # at max_tokens: complete now
                seq.status, seq.finish_time = self._stop_reason(seq, token, eos_token_id), now
                done.append(seq)
                continue
            told[seq.seq_id] = token
            if token == eos_token_id or seq.params.stop_token_ids:  # else it cannot stop
                status = self._stop_reason(seq, token, eos_token_id)
                if status is not None:
                    stopped[seq.seq_id] = status
        if told:  # before any of them is freed
            self.manager.end_step(None, sampled=told)
        if stopped and not keep_running:
            for seq in seqs:
                if seq.seq_id in stopped:
                    self._finish(seq, stopped[seq.seq_id], now)
                    done.append(seq)
            self.running[:] = [s for s in self.running if s.seq_id not in stopped]
            stopped = {}
        return stopped, done


# %% chapters/15_prefill_and_overlap.md § Host work off the critical path
@dataclass
class InFlightStep:
    """A decode step launched and committed before the host read its tokens."""

    rows: dict            # seq_id -> row of ``tokens``
    tokens: torch.Tensor  # [rows] on the device: the next step's input ids
    host: torch.Tensor    # [rows] their copy on the host (pinned on a GPU)
    ready: object         # the CUDA event of that copy (None on a CPU)
    placeholders: list = None  # (sequence, row) of every UNRESOLVED token


# %% chapters/15_prefill_and_overlap.md § Host work off the critical path
class OverlapStepLoop(StepLoop):
    """Chapter 12's step loop, with each plain decode step launched before the
    previous step's tokens reach the host, and committed before its own do. Needs
    the ``OverlapScheduler``."""

    def __init__(self, engine) -> None:
        super().__init__(engine)
        self.overlapped_steps = 0
        self.launched: InFlightStep | None = None

    def in_flight(self) -> bool:
        return self.launched is not None or bool(self.ready)

    def settle(self) -> None:
        """Read the tokens in flight, if any: the engine is synchronous again."""
        self._resolve(keep_running=False)

    # %% chapters/15_prefill_and_overlap.md § Host work off the critical path
    def step(self) -> list:
        """Chapter 12's step; a plain decode step is launched before the previous step's
        tokens are read, and committed before its own are."""
        engine = self.engine
        if not engine.scheduler.next_is_decode() or any(  # log-probabilities: synchronous
                s.params.logprobs is not None for s in engine.scheduler.running):
            self.settle()
            finished, self.ready = self.ready + super().step(), []
            return finished
        t0 = time.perf_counter()
        out = engine.scheduler.schedule()
        t1 = time.perf_counter()
        launched = self._launch(out)
        stopped = self._resolve(keep_running=True)  # step t's tokens, while t+1 runs
        t2 = time.perf_counter()
        done = engine.scheduler.commit_unresolved(out, stopped)
        self._finished([s for s in done if s.seq_id in stopped])  # the others hold a placeholder
        launched.placeholders = [(c.seq, row) for row, c in enumerate(out.chunks)
                                 if c.seq.seq_id not in stopped]
        self.launched = launched
        self.overlapped_steps += 1
        engine.account(out, len(launched.placeholders), t1 - t0 + time.perf_counter() - t2,
                       t2 - t1)
        finished, self.ready = self.ready, []
        return finished

    def _launch(self, out: SchedulerOutput) -> InFlightStep:
        """Queue a decode step's forward and sampling; its tokens start for the host."""
        runner, previous = self.engine.runner, self.launched
        seqs = [c.seq for c in out.chunks]
        try:
            runner.move_blocks(out)
            if previous is None:
                logits = runner.forward(out)[0]
            else:  # the input ids are the previous step's tokens, still on the GPU
                rows = torch.tensor([previous.rows[c.seq.seq_id] for c in out.chunks])
                logits = runner.decode(out, previous.tokens[to_device(rows,
                                                                      previous.tokens.device)])
            tokens = runner.sampler(logits, seqs)
        except BaseException:
            self.engine.scheduler.abort_step(out)
            raise
        host, ready = tokens, None
        if tokens.is_cuda:
            host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            host.copy_(tokens, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()
        return InFlightStep({s.seq_id: i for i, s in enumerate(seqs)}, tokens, host, ready)

    # %% chapters/15_prefill_and_overlap.md § Host work off the critical path
    def _resolve(self, keep_running: bool) -> dict:
        """Wait for the in-flight step's tokens and put them in place. Returns the
        sequences they stopped that are also in a launched step (see ``resolve``)."""
        step, self.launched = self.launched, None
        if step is None:
            return {}
        if step.ready is not None:
            step.ready.synchronize()
        tokens = step.host.tolist()
        seqs = [seq for seq, _ in step.placeholders]
        stopped, done = self.engine.scheduler.resolve(
            seqs, [tokens[row] for _, row in step.placeholders], self.engine.eos_token_id,
            keep_running)
        if not keep_running:
            done += self.stop_on_text(seqs)
        for seq in self.engine.output_processor.text_stops(seqs):  # in a launched step
            if seq.status.finished:
                seq.status = SequenceStatus.FINISHED_STOPPED
            else:
                stopped[seq.seq_id] = SequenceStatus.FINISHED_STOPPED
        self._finished(done)
        return stopped

    def _finished(self, done: list[Sequence]) -> None:
        """Account finished sequences that hold their true tokens; queue the output of each
        request that is finished and holds no placeholder any more."""
        self.ready += self.engine.finish(done, complete=lambda request: not any(
            s.output_token_ids and s.output_token_ids[-1] == UNRESOLVED for s in request.seqs))
