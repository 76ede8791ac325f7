# GENERATED from chapters/10_scheduler.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/10_scheduler.md § Requests and sequences
"""Continuous-batching scheduler: queues, admission by blocks and tokens, preemption."""

from __future__ import annotations

import enum
import numbers
import operator
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from minipaged.memory.block_manager import StepReservation
from minipaged.memory.block_table import blocks_needed

__all__ = [
    "SAMPLING_EPS",
    "MAX_LOGPROBS",
    "SamplingParams",
    "SequenceStatus",
    "Sequence",
    "SchedulerConfig",
    "ScheduledChunk",
    "SchedulerOutput",
    "StepStats",
    "Scheduler",
    "SchedulerError",
    "PromptTooLongError",
]


class SchedulerError(RuntimeError):
    """The scheduler was asked for something it cannot do (unknown sequence...)."""


class PromptTooLongError(ValueError):
    """A prompt can never be served: longer than the model allows, or than the cache."""


# %% chapters/10_scheduler.md § Requests and sequences
SAMPLING_EPS = 1e-5
"""A temperature below this is greedy (vLLM's ``_SAMPLING_EPS``): dividing logits by
a tinier one can overflow."""
MAX_LOGPROBS = 20
"""The most top log-probabilities a request may ask for per token (vLLM's default)."""


def _is_int(value) -> bool:
    """An integer (Python's or numpy's), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _stop_token_ids(stop) -> tuple[int, ...]:
    """``stop_token_ids`` as a tuple of ints, or a ``ValueError``."""
    if isinstance(stop, (str, bytes)) or not hasattr(stop, "__iter__") or not all(
            _is_int(t) for t in stop):
        raise ValueError("stop_token_ids must be a sequence of integers (token ids), "
                         f"got {stop!r}")
    return tuple(operator.index(t) for t in stop)


def _stop_strings(stop) -> tuple[str, ...]:
    """``stop`` (a string or strings) as a tuple of distinct non-empty strings."""
    words = (stop,) if isinstance(stop, str) else stop
    if (not hasattr(words, "__iter__") or isinstance(words, bytes)
            or not all(isinstance(w, str) and w for w in words)):
        raise ValueError("stop must be a string or a list of non-empty strings, got "
                         f"{stop!r}")
    return tuple(dict.fromkeys(words))


# %% chapters/10_scheduler.md § Requests and sequences
@dataclass(frozen=True)
class SamplingParams:
    """How to turn logits into tokens, and when to stop (vLLM's names).

    ``temperature=0`` (or anything below ``SAMPLING_EPS``) is greedy. ``top_k <= 0`` and
    ``top_p == 1`` switch those filters off. ``n`` samples per prompt share the prompt's
    KV blocks (fork). ``seed`` makes one request's samples reproducible whatever else is
    in the batch. ``stop`` strings end a request when its text holds one (chapter 12's
    engine cuts the text there, keeping the stop string if
    ``include_stop_str_in_output``). ``logprobs=k`` (0 to 20) reports, per generated
    token, the log-probability of the sampled token and of the ``k`` most likely ones.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 16
    ignore_eos: bool = False
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    logprobs: int | None = None

    def __post_init__(self) -> None:
        for name in ("n", "max_tokens"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.temperature, numbers.Real) or self.temperature < 0:
            raise ValueError("temperature must be a number >= 0 (0 = greedy), got "
                             f"{self.temperature!r}")
        if not isinstance(self.top_p, numbers.Real) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k):
            raise ValueError(
                f"top_k must be an integer (<= 0 disables it), got {self.top_k!r}")
        if self.seed is not None:
            if not _is_int(self.seed):
                raise ValueError(f"seed must be an integer or None, got {self.seed!r}")
            object.__setattr__(self, "seed", operator.index(self.seed))
        object.__setattr__(self, "stop_token_ids", _stop_token_ids(self.stop_token_ids))
        object.__setattr__(self, "stop", _stop_strings(self.stop))
        if self.logprobs is not None and (not _is_int(self.logprobs)
                                          or not 0 <= self.logprobs <= MAX_LOGPROBS):
            raise ValueError(f"logprobs must be None or an integer in [0, {MAX_LOGPROBS}], "
                             f"got {self.logprobs!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS


# %% chapters/10_scheduler.md § Requests and sequences
class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self.value in ("stop", "length", "abort")


@dataclass(eq=False)
class Sequence:
    """One generation stream: its tokens, how many have KV in the cache, and its clock.

    ``num_computed_tokens`` counts the tokens whose keys and values are in the cache. A
    sequence preempted by recompute drops to 0 and re-prefills prompt + output so far.
    """

    seq_id: int
    request_id: str | int
    prompt_token_ids: list[int]
    params: SamplingParams
    sample_index: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    num_cached_prompt_tokens: int = 0
    num_preemptions: int = 0
    arrival_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    finish_time: float | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    def token_ids(self, start: int, stop: int) -> list[int]:
        """Tokens ``start:stop`` of prompt + output, without building the whole list."""
        prompt = self.prompt_token_ids
        if stop <= len(prompt):
            return prompt[start:stop]
        if start >= len(prompt):
            return self.output_token_ids[start - len(prompt):stop - len(prompt)]
        return prompt[start:] + self.output_token_ids[:stop - len(prompt)]

    @property
    def finish_reason(self) -> str | None:
        return self.status.value if self.status.finished else None


# %% chapters/10_scheduler.md § What a step looks like
@dataclass(frozen=True)
class SchedulerConfig:
    """Limits and policy of the scheduler.

    ``policy="decode_first"``: every step carries all running decodes, and prefills fill
    what is left of the token budget (one mixed batch). ``"prefill_first"``: while
    waiting prompts can be admitted a step is prefill only and the decodes wait (vLLM's
    original scheduler). ``preemption_mode``: ``"recompute"`` frees a victim's blocks
    and re-prefills it later; ``"swap"`` copies its blocks to the CPU pool and back.
    ``watermark_blocks`` free blocks are kept back from every step.
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 4096
    policy: Literal["decode_first", "prefill_first"] = "decode_first"
    preemption_mode: Literal["recompute", "swap"] = "recompute"
    enable_chunked_prefill: bool = False
    watermark_blocks: int = 0

    def __post_init__(self) -> None:
        if self.policy not in ("decode_first", "prefill_first"):
            raise ValueError(
                f"policy must be 'decode_first' or 'prefill_first', "
                f"got {self.policy!r}")
        if self.preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"preemption_mode must be 'recompute' or 'swap', "
                             f"got {self.preemption_mode!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.watermark_blocks < 0:
            raise ValueError(
                f"watermark_blocks must be >= 0, got {self.watermark_blocks}")


@dataclass(slots=True)
class ScheduledChunk:
    """``num_tokens`` consecutive tokens of ``seq`` from position ``start``.

    ``samples`` is True when the chunk ends at the sequence's last token: its last
    logits give the next token (a prefill chunk that stops mid-prompt samples nothing).
    """

    seq: Sequence
    start: int
    num_tokens: int

    @property
    def is_prefill(self) -> bool:
        return self.num_tokens > 1 or self.start < len(self.seq.prompt_token_ids)

    @property
    def samples(self) -> bool:
        seq = self.seq  # (Sequence.num_tokens written out: asked of every chunk)
        end = len(seq.prompt_token_ids) + len(seq.output_token_ids)
        return self.start + self.num_tokens == end


# %% chapters/10_scheduler.md § What a step looks like
@dataclass
class StepStats:
    """What one step looked like: the rows of the timeline figures."""

    step: int
    time: float
    num_waiting: int
    num_running: int
    num_swapped: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_preempted: int
    kv_utilization: float


@dataclass
class SchedulerOutput:
    """One step's work: the chunks to run, and what the cache does before the forward.

    ``reservation`` is the block manager's ``StepReservation`` for the chunks, in the
    same order: its ``slot_mapping``, ``positions``, ``seq_lens`` and ``block_tables``
    are all the model needs besides the tokens, its ``copies`` are copy-on-write block
    copies. ``swap_out`` / ``swap_in`` are (src, dst) block pairs to move between the
    GPU pool and the CPU pool, out before in.
    """

    chunks: list[ScheduledChunk] = field(default_factory=list)
    admitted: list[Sequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    reservation: StepReservation | None = None
    stats: StepStats | None = None

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    @property
    def is_empty(self) -> bool:
        return not self.chunks


# %% chapters/10_scheduler.md § Requests in and out
class Scheduler:
    """Decides, step by step, which sequences run, and reserves the blocks they write.

    Three queues: ``waiting`` (never run, or preempted by recompute), ``running`` (KV in
    the GPU pool, in admission order) and ``swapped`` (KV parked in the CPU pool).
    ``schedule()`` picks the step's chunks and reserves all their blocks in one
    ``reserve_step`` call (every block or none); after the forward, ``commit()`` ends
    the step and records the sampled tokens. ``manager`` is a chapter 4-6
    ``KVBlockManager``, used only through chapter 4's seam (``usage``,
    ``find_cached_prefix``, ``allocate_prompt``, ``num_blocks_to_allocate``,
    ``reserve_step``, ``end_step``, ``move``, ``inconsistency_with``); the scheduler is
    its only caller while serving.
    """

    def __init__(self, manager, config: SchedulerConfig | None = None) -> None:
        self.manager = manager
        self.config = config or SchedulerConfig()
        usage = manager.usage()
        self.block_size: int = usage.block_size
        self.num_total_blocks: int = usage.num_blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.swapped: deque[Sequence] = deque()
        self.step_count = 0
        self.total_preemptions = 0
        self.timeline: list[StepStats] = []
        self._live: dict[int, Sequence] = {}
        # Blocks one sequence may hold, and the length at which it must stop:
        # max_model_len, or when its next token would need more blocks than that
        # (ceil((n + 1) / B) > blocks <=> n >= blocks * B).
        self._usable_blocks = self.num_total_blocks - self.config.watermark_blocks
        self._length_limit = min(self.config.max_model_len,
                                 self._usable_blocks * self.block_size)

    # %% chapters/10_scheduler.md § Requests in and out
    def check_prompt(self, num_prompt_tokens: int) -> None:
        """Raise ``PromptTooLongError`` if a prompt this long can never be served."""
        limit, n = self.config.max_model_len, num_prompt_tokens
        if n == 0:
            raise PromptTooLongError("empty prompt: give at least one token")
        if n >= limit:
            raise PromptTooLongError(
                f"prompt of {n} tokens does not fit max_model_len={limit} (it needs room "
                + "for at least one new token): shorten the prompt or raise max_model_len")
        blocks = blocks_needed(n + 1, self.block_size)
        if blocks > self._usable_blocks:
            raise PromptTooLongError(
                f"prompt of {n} tokens needs {blocks} KV blocks but the cache has "
                + f"{self._usable_blocks}: give it more blocks (num_blocks) or shorten "
                + "the prompt")

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence, or raise (queueing nothing) if it can never run."""
        self.check_prompt(len(seq.prompt_token_ids))
        if seq.seq_id in self._live:
            raise SchedulerError(f"sequence id {seq.seq_id} is already scheduled")
        seq.status = SequenceStatus.WAITING
        self._live[seq.seq_id] = seq
        self.waiting.append(seq)

    # %% chapters/10_scheduler.md § Requests in and out
    def abort(self, seq_id: int) -> Sequence:
        """Cancel a sequence wherever it is; its blocks (GPU or CPU) are freed now."""
        seq = self._live.get(seq_id)
        if seq is None:
            raise SchedulerError(
                f"unknown sequence {seq_id}: finished, aborted, or never added")
        for queue in (self.waiting, self.running, self.swapped):
            if seq in queue:
                queue.remove(seq)
        self._finish(seq, SequenceStatus.FINISHED_ABORTED)
        return seq

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    # %% chapters/10_scheduler.md § One step
    def schedule(self) -> SchedulerOutput:
        """Pick this step's chunks and reserve their blocks; run them, then commit."""
        self.step_count += 1
        out = SchedulerOutput()
        budget = [self.config.max_num_batched_tokens, 0]  # tokens left, blocks claimed
        if self.config.policy == "prefill_first":
            self._schedule_waiting(out, budget)
        if not out.chunks:
            self._schedule_running(out, budget)
            if not out.preempted:
                if self.swapped:
                    self._schedule_swapped(out, budget)
                if self.config.policy == "decode_first":
                    self._schedule_waiting(out, budget)
        if out.chunks:  # planned within the free blocks, so this takes them all
            out.reservation = self.manager.reserve_step(
                {c.seq.seq_id: c.num_tokens for c in out.chunks})
        out.stats = self._stats(out)
        self.timeline.append(out.stats)
        return out

    def _free_after(self, claimed: int) -> int:
        """Free blocks this step may still claim: the watermark stays free."""
        return self.manager.usage().num_free_blocks - claimed - self.config.watermark_blocks

    def _need(self, seq: Sequence, num_tokens: int) -> int:
        """Blocks ``num_tokens`` more tokens of running ``seq`` take (copy-on-write too)."""
        return self.manager.num_blocks_to_allocate({seq.seq_id: num_tokens})

    def _stats(self, out: SchedulerOutput) -> StepStats:
        # ScheduledChunk.is_prefill and SchedulerOutput.num_tokens written out: one pass
        total = prefill = 0
        for c in out.chunks:
            total += c.num_tokens
            if c.num_tokens > 1 or c.start < len(c.seq.prompt_token_ids):
                prefill += c.num_tokens
        used = self.num_total_blocks - self.manager.usage().num_free_blocks
        return StepStats(
            step=self.step_count, time=time.perf_counter(),
            num_waiting=len(self.waiting), num_running=len(self.running),
            num_swapped=len(self.swapped), num_prefill_tokens=prefill,
            num_decode_tokens=total - prefill, num_preempted=len(out.preempted),
            kv_utilization=used / self.num_total_blocks)

    # %% chapters/10_scheduler.md § Decodes, and preemption
    def _schedule_running(self, out: SchedulerOutput, budget: list[int]) -> None:
        if self._decode_step(out, budget):
            return
        running, i = self.running, 0
        while i < len(running) and budget[0] > 0:
            seq = running[i]
            n = min(seq.num_uncomputed_tokens, budget[0])
            need = self._need(seq, n)
            while need > self._free_after(budget[1]):
                victim = self.select_victim(running[i:])  # seq and those not yet served
                self._preempt(victim, out)
                if victim is seq:
                    break
            else:
                out.chunks.append(ScheduledChunk(seq, seq.num_computed_tokens, n))
                budget[0] -= n
                budget[1] += need
                i += 1

    def _decode_step(self, out: SchedulerOutput, budget: list[int]) -> bool:
        """Plan the step where every running sequence decodes one token, if it fits."""
        running = self.running
        if not running or budget[0] < len(running):
            return False
        for s in running:  # Sequence.num_uncomputed_tokens written out (hot loop)
            computed = s.num_computed_tokens
            if len(s.prompt_token_ids) + len(s.output_token_ids) - computed != 1:
                return False
        free = self._free_after(budget[1])
        if self.waiting or self.swapped or free < len(running):
            step = dict.fromkeys([s.seq_id for s in running], 1)
            need = self.manager.num_blocks_to_allocate(step)
            if need > free:
                return False
        else:
            need = len(running)  # at most one block per decode token; nobody competes
        out.chunks.extend([ScheduledChunk(s, s.num_computed_tokens, 1)
                           for s in running])
        budget[0] -= len(running)
        budget[1] += need
        return True

    # %% chapters/10_scheduler.md § Decodes, and preemption
    def select_victim(self, candidates: list[Sequence]) -> Sequence:
        """The running sequence that gives its blocks back so ``candidates[0]`` can run.

        ``candidates`` are the sequences not yet served in this step, oldest first; the
        first is the one that needs blocks. The newest yields (it may be that one).
        """
        return candidates[-1]

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        """Take a running sequence's blocks back: swap them out, or drop them."""
        self.running.remove(seq)
        seq.num_preemptions += 1
        self.total_preemptions += 1
        out.preempted.append(seq)
        if self.config.preemption_mode == "swap" and self._swap_out(seq, out):
            return
        self.manager.move(seq.seq_id, None)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)

    # %% chapters/10_scheduler.md § Admission
    def _seats(self, seq: Sequence) -> int:
        """Running seats ``seq`` holds once it samples: ``n`` for a request's first sequence
        before its first token (its siblings fork then), else 1."""
        forks = seq.params.n > 1 and seq.sample_index == 0 and not seq.output_token_ids
        return seq.params.n if forks else 1

    def _run(self, seq: Sequence, n: int, out: SchedulerOutput, budget: list[int]) -> int:
        """Put ``seq`` in the running queue with a chunk of ``n`` tokens this step; charge the
        step's budget (tokens, blocks) and return the running seats it takes."""
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        out.chunks.append(ScheduledChunk(seq, seq.num_computed_tokens, n))
        budget[0] -= n
        budget[1] += self._need(seq, n)
        return self._seats(seq)

    def _schedule_waiting(self, out: SchedulerOutput, budget: list[int]) -> None:
        if self.swapped or not self.waiting:  # parked sequences come back first
            return
        seats = sum(self._seats(s) for s in self.running)  # siblings still to fork included
        while (self.waiting and seats + self._seats(self.waiting[0])
               <= self.config.max_num_seqs):
            seq = self.waiting[0]
            tokens = seq.token_ids(0, seq.num_tokens)
            prefix = self.manager.find_cached_prefix(tokens)  # looked up once, used twice
            n = seq.num_tokens - len(prefix.blocks) * self.block_size
            if n > budget[0]:
                if self.config.enable_chunked_prefill:
                    n = budget[0]  # a chunk now, the rest in later steps
                    if n == 0:
                        return
                elif any(c.is_prefill for c in out.chunks):
                    return  # unchunked, a prompt over budget is the only prefill
            need = prefix.num_revived + blocks_needed(n, self.block_size)
            if need > self._free_after(budget[1]):
                return
            self.waiting.popleft()
            out.admitted.append(seq)
            seq.num_computed_tokens = self.manager.allocate_prompt(seq.seq_id, tokens, prefix)
            if seq.num_preemptions == 0:
                seq.num_cached_prompt_tokens = seq.num_computed_tokens
            seats += self._run(seq, n, out, budget)

    # %% chapters/10_scheduler.md § After the forward
    def commit(self, out: SchedulerOutput, sampled: dict[int, int],
               eos_token_id: int | None = None,
               forks: list[tuple[Sequence, Sequence, int]] = (),
               now: float | None = None) -> list[Sequence]:
        """The forward ran: commit the reservation and append ``sampled[seq_id]`` to
        every chunk that samples. ``forks`` are ``(parent, child, child_token)``: the
        children of ``n > 1`` requests, sharing the parent's blocks (copy-on-write).
        Returns the sequences that finished in this step (their blocks already freed).
        """
        now = time.perf_counter() if now is None else now
        events = []
        running = SequenceStatus.RUNNING
        for chunk in out.chunks:
            seq = chunk.seq
            end = chunk.start + chunk.num_tokens
            seq.num_computed_tokens = end
            if (end == len(seq.prompt_token_ids) + len(seq.output_token_ids)
                    and seq.status is running):
                events.append((seq, sampled[seq.seq_id]))  # the chunk samples
        for parent, child, token in forks:
            child.num_computed_tokens = parent.num_computed_tokens
            child.num_cached_prompt_tokens = parent.num_cached_prompt_tokens
            child.status = SequenceStatus.RUNNING
            self._live[child.seq_id] = child
            self.running.append(child)
            events.append((child, token))
        self.manager.end_step(out.reservation,  # forks share blocks before tokens are told
                              forks=[(p.seq_id, c.seq_id) for p, c, _ in forks],
                              sampled={seq.seq_id: token for seq, token in events})
        out.reservation = None
        return self._append_tokens(events, eos_token_id, now)

    # %% chapters/10_scheduler.md § After the forward
    def _append_tokens(self, events: list[tuple[Sequence, int]],
                       eos_token_id: int | None, now: float) -> list[Sequence]:
        done = []
        limit = self._length_limit
        for seq, token in events:
            outputs = seq.output_token_ids
            outputs.append(token)
            if seq.first_token_time is None:
                seq.first_token_time = now
            params = seq.params
            # One cheap test that every stop condition implies; _stop_reason decides.
            if (token == eos_token_id or params.stop_token_ids
                    or len(outputs) >= params.max_tokens
                    or len(seq.prompt_token_ids) + len(outputs) >= limit):
                reason = self._stop_reason(seq, token, eos_token_id)
                if reason is not None:
                    self._finish(seq, reason, now)
                    done.append(seq)
        if done:  # one pass over the running queue, however many finished
            finished = set(done)
            self.running[:] = [s for s in self.running if s not in finished]
        return done

    # %% chapters/10_scheduler.md § After the forward
    def abort_step(self, out: SchedulerOutput) -> None:
        """The forward failed: give the step's blocks back and return the sequences it
        admitted to the front of the waiting queue; the next schedule tries again."""
        if out.reservation is not None:
            self.manager.end_step(out.reservation, ran=False)
            out.reservation = None
        for seq in reversed(out.admitted):
            if seq.status is SequenceStatus.RUNNING:
                self.running.remove(seq)
                self.manager.move(seq.seq_id, None)
                seq.num_computed_tokens = 0
                seq.status = SequenceStatus.WAITING
                self.waiting.appendleft(seq)

    # %% chapters/10_scheduler.md § After the forward
    def _stop_reason(self, seq: Sequence, token: int,
                     eos_token_id: int | None) -> SequenceStatus | None:
        params = seq.params
        if not params.ignore_eos and eos_token_id is not None and token == eos_token_id:
            return SequenceStatus.FINISHED_STOPPED
        if token in params.stop_token_ids:
            return SequenceStatus.FINISHED_STOPPED
        if (len(seq.output_token_ids) >= params.max_tokens
                or seq.num_tokens >= self._length_limit):  # or one more would not fit
            return SequenceStatus.FINISHED_LENGTH
        return None

    def _finish(self, seq: Sequence, status: SequenceStatus,
                now: float | None = None) -> None:
        if seq.status is SequenceStatus.RUNNING or seq.status is SequenceStatus.SWAPPED:
            self.manager.move(seq.seq_id, None)  # its blocks, on the GPU or the CPU
        seq.status = status
        seq.finish_time = time.perf_counter() if now is None else now
        self._live.pop(seq.seq_id, None)

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` if queues, statuses and the manager disagree."""
        queued = [*self.waiting, *self.running, *self.swapped]
        assert len({id(s) for s in queued}) == len(queued), "a sequence in two queues"
        assert {s.seq_id for s in queued} == set(self._live), "a live one in no queue"
        assert all(s.status is SequenceStatus.WAITING for s in self.waiting)
        assert all(s.status is SequenceStatus.RUNNING for s in self.running)
        assert all(s.status is SequenceStatus.SWAPPED for s in self.swapped)
        assert len(self.running) <= self.config.max_num_seqs
        # the manager holds the running sequences' blocks, at their lengths, and nothing else
        problem = self.manager.inconsistency_with(
            {s.seq_id: s.num_computed_tokens for s in self.running})
        assert problem is None, problem

    # %% chapters/10_scheduler.md § Addition: preemption by swap
    def _swap_out(self, seq: Sequence, out: SchedulerOutput) -> bool:
        """Park a victim's blocks in the CPU pool; False (recompute) if they can't."""
        copies = self.manager.move(seq.seq_id, "cpu")
        if copies is None:  # the CPU pool is too small (or there is none)
            return False
        out.swap_out.extend(copies)
        seq.status = SequenceStatus.SWAPPED
        self.swapped.append(seq)
        return True

    def _schedule_swapped(self, out: SchedulerOutput, budget: list[int]) -> None:
        seats = sum(self._seats(s) for s in self.running)
        while (self.swapped and seats + self._seats(self.swapped[0])
               <= self.config.max_num_seqs):
            seq = self.swapped[0]
            n = seq.num_uncomputed_tokens
            if n > budget[0] and self.config.enable_chunked_prefill:
                n = budget[0]  # a prompt parked mid-prefill: a chunk now
            need = blocks_needed(seq.num_computed_tokens + n, self.block_size)
            if n == 0 or n > budget[0] or need > self._free_after(budget[1]):
                return
            self.swapped.popleft()
            out.swap_in.extend(self.manager.move(seq.seq_id, "gpu"))
            seats += self._run(seq, n, out, budget)
