# GENERATED from chapters/02_fragmentation.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/02_fragmentation.md § Four ways to give out memory
"""Where KV memory goes under contiguous reservation and under paging.

Workloads, a first-fit heap, and a simulator that labels every slot at every step
(``minipaged.book.trace`` runs it on a CSV trace, from the command line).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from minipaged.memory.sizing import ceil_div

__all__ = [
    "TraceRequest", "WorkloadSpec", "WORKLOADS",
    "clipped_lognormal_mean", "fit_lognormal_mu", "generate_workload", "poisson_arrivals",
    "POLICIES", "reservation_tokens", "FirstFitAllocator", "SimulationResult",
    "simulate",
]

POLICIES = ("max", "pow2", "oracle", "paged")


def reservation_tokens(policy: str, total_len: int, max_len: int) -> int:
    """Tokens a contiguous policy reserves for a request that will store
    ``total_len``."""
    if not 1 <= total_len <= max_len:
        raise ValueError(f"total_len must be in [1, max_len={max_len}], "
                         f"got {total_len}")
    if policy == "max":
        return max_len
    if policy == "pow2":
        return min(max_len, 1 << (total_len - 1).bit_length())
    if policy == "oracle":
        return total_len
    raise ValueError(f"{policy!r} is not a contiguous policy; "
                     "choose max, pow2 or oracle")


# %% chapters/02_fragmentation.md § A workload, from published statistics
@dataclass(frozen=True)
class TraceRequest:
    """One request of a workload: arrival (in decode steps) and its token counts."""

    arrival: float
    prompt_len: int
    output_len: int

    @property
    def total_len(self) -> int:
        """Tokens whose KV the request stores when it finishes: prompt plus output."""
        return self.prompt_len + self.output_len


@dataclass(frozen=True)
class WorkloadSpec:
    """Length statistics of a workload: mean tokens (targets) and log-normal spreads
    (choices)."""

    prompt_mean: float
    output_mean: float
    prompt_sigma: float
    output_sigma: float
    source: str = ""


_FIG11 = "vLLM paper (Kwon et al. 2023), Fig. 11"
WORKLOADS = {
    "sharegpt": WorkloadSpec(161.31, 337.99, 1.0, 1.0, _FIG11),
    "alpaca": WorkloadSpec(19.31, 58.45, 0.5, 0.8, _FIG11),
}


# %% chapters/02_fragmentation.md § A workload, from published statistics
def _normal_cdf(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def clipped_lognormal_mean(mu: float, sigma: float, cap: float) -> float:
    """E[min(X, cap)] for X ~ LogNormal(mu, sigma)."""
    if sigma <= 0 or cap <= 0:
        raise ValueError(f"sigma and cap must be positive, got {sigma}, {cap}")
    log_cap = math.log(cap)
    body = math.exp(mu + sigma**2 / 2) * _normal_cdf((log_cap - mu - sigma**2) / sigma)
    return body + cap * (1.0 - _normal_cdf((log_cap - mu) / sigma))


def fit_lognormal_mu(mean: float, sigma: float, cap: float) -> float:
    """The mu for which min(X, cap), X ~ LogNormal(mu, sigma), has the given mean."""
    if not 0 < mean < cap:
        raise ValueError(f"the mean must lie in (0, cap={cap}), got {mean}")
    # the unclipped fit: its clipped mean is too small
    low = math.log(mean) - sigma**2 / 2
    high = low + 1.0
    while clipped_lognormal_mean(high, sigma, cap) < mean:
        high += 1.0
    for _ in range(100):  # bisection
        middle = (low + high) / 2
        if clipped_lognormal_mean(middle, sigma, cap) < mean:
            low = middle
        else:
            high = middle
    return (low + high) / 2


# %% chapters/02_fragmentation.md § A workload, from published statistics
def _lengths(rng: np.random.Generator, mean: float, sigma: float, cap: int,
             n: int) -> np.ndarray:
    mu = fit_lognormal_mu(mean, sigma, cap)
    return np.clip(np.rint(rng.lognormal(mu, sigma, n)), 1, cap).astype(np.int64)


def poisson_arrivals(rng: np.random.Generator, n: int,
                     rate: float | None) -> np.ndarray:
    """Arrival steps of ``n`` requests, Poisson at ``rate`` per step (None: all at 0)."""
    if rate is None:
        return np.zeros(n)
    if rate <= 0:
        raise ValueError(f"rate must be positive (requests per step), got {rate}")
    gaps = rng.exponential(1.0 / rate, n)
    return np.concatenate(([0.0], np.cumsum(gaps[:-1]))) if n else gaps


def generate_workload(name: str = "sharegpt", num_requests: int = 1000, seed: int = 0,
                      *, rate: float | None = 1.0, max_len: int = 2048,
                      spec: WorkloadSpec | None = None) -> list[TraceRequest]:
    """Draw ``num_requests`` requests with log-normal lengths and Poisson arrivals.

    ``name`` picks a spec from ``WORKLOADS`` (``spec`` overrides it). Lengths are
    fitted so their means match the spec after clipping; ``prompt + output <=
    max_len``. ``rate`` is in requests per decode step; ``None`` makes every request
    arrive at step 0.
    """
    if spec is None:
        if name not in WORKLOADS:
            raise ValueError(f"unknown workload {name!r}; "
                             f"choose one of {sorted(WORKLOADS)}")
        spec = WORKLOADS[name]
    if num_requests < 0 or max_len < 2:
        raise ValueError("need num_requests >= 0 and max_len >= 2, got "
                         f"{num_requests}, {max_len}")
    rng = np.random.default_rng(seed)
    cap = max_len - 1
    prompt = _lengths(rng, spec.prompt_mean, spec.prompt_sigma, cap, num_requests)
    output = _lengths(rng, spec.output_mean, spec.output_sigma, cap, num_requests)
    output = np.minimum(output, max_len - prompt)
    arrivals = poisson_arrivals(rng, num_requests, rate)
    return [TraceRequest(float(a), int(p), int(o))
            for a, p, o in zip(arrivals, prompt, output)]


# %% chapters/02_fragmentation.md § First fit: the allocator behind contiguous regions
class FirstFitAllocator:
    """Contiguous regions of a ``capacity``-token space: first fit, free neighbours
    merged."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.capacity = capacity
        self._starts: list[int] = [0]   # free holes, sorted by address
        self._sizes: list[int] = [capacity]
        self._regions: dict[int, int] = {}  # allocated start -> size
        self.free_tokens = capacity

    def allocate(self, size: int) -> int | None:
        """Start of a new region of ``size`` tokens, or None if no hole fits it."""
        if size <= 0:
            raise ValueError(f"size must be positive, got {size}")
        for i, hole in enumerate(self._sizes):
            if hole >= size:
                return self._take(i, size)
        return None

    def _take(self, i: int, size: int) -> int:
        """Carve ``size`` tokens from the front of hole ``i``; the region's start."""
        start = self._starts[i]
        if self._sizes[i] == size:
            del self._starts[i], self._sizes[i]
        else:
            self._starts[i] += size
            self._sizes[i] -= size
        self._regions[start] = size
        self.free_tokens -= size
        return start

    def holes(self) -> list[tuple[int, int]]:
        """Free holes as (start, size), by address."""
        return list(zip(self._starts, self._sizes))

    def largest_hole(self) -> int:
        """Size of the largest free hole: the largest region it can allocate now."""
        return max(self._sizes, default=0)

    # %% chapters/02_fragmentation.md § First fit: the allocator behind contiguous regions
    def free(self, start: int) -> None:
        """Return the region that starts at ``start``; merge it with free neighbours."""
        if start not in self._regions:
            raise ValueError(f"no allocated region starts at {start} (double free?)")
        size = self._regions.pop(start)
        self.free_tokens += size
        i = bisect.bisect_left(self._starts, start)
        self._starts.insert(i, start)
        self._sizes.insert(i, size)
        if i + 1 < len(self._starts) and start + size == self._starts[i + 1]:  # merge right
            self._sizes[i] += self._sizes.pop(i + 1)
            del self._starts[i + 1]
        if i > 0 and self._starts[i - 1] + self._sizes[i - 1] == start:  # merge left
            self._sizes[i - 1] += self._sizes.pop(i)
            del self._starts[i]


# %% chapters/02_fragmentation.md § The full simulator
_STATES = ("token_states", "reservation", "internal",
           "external", "headroom", "blocked", "free")
_SERIES = _STATES + ("running", "waiting")


@dataclass
class SimulationResult:
    """Token counts per recorded step (numpy arrays) and totals of one run."""

    policy: str
    budget_tokens: int
    block_size: int | None
    max_len: int
    num_requests: int
    steps: np.ndarray
    token_states: np.ndarray
    reservation: np.ndarray
    internal: np.ndarray
    external: np.ndarray
    headroom: np.ndarray
    blocked: np.ndarray
    free: np.ndarray
    running: np.ndarray
    waiting: np.ndarray
    generated_tokens: int
    preemptions: int
    truncated: int

    @property
    def busy(self) -> np.ndarray:
        """Mask of the steps in which a request was waiting (all steps if there were
        none)."""
        mask = self.waiting > 0
        return mask if mask.any() else np.ones_like(mask)

    def shares(self) -> dict[str, float]:
        """Mean share of the budget in each state over the busy steps (sum: 1)."""
        mask = self.busy
        return {name: float(getattr(self, name)[mask].mean() / self.budget_tokens)
                for name in _STATES}

    def summary(self) -> dict:
        """JSON-ready result: the shares, concurrency, and what the run did."""
        mask = self.busy
        total_steps = int(self.steps[-1]) + 1 if len(self.steps) else 0
        return {
            "policy": self.policy, "budget_tokens": self.budget_tokens,
            "block_size": self.block_size, "max_len": self.max_len,
            **{k: round(v, 6) for k, v in self.shares().items()},
            "mean_running": (round(float(self.running[mask].mean()), 3)
                             if len(mask) else 0.0),
            "requests": self.num_requests, "steps": total_steps,
            "busy_steps": int((self.waiting > 0).sum()),
            "tokens_per_step": round(self.generated_tokens / max(total_steps, 1), 3),
            "preemptions": self.preemptions, "truncated": self.truncated,
        }


# %% chapters/02_fragmentation.md § The full simulator
class _ContiguousMemory:
    """One first-fit region per request, reserved on admission for all its future
    tokens."""

    def __init__(self, policy: str, budget_tokens: int, max_len: int) -> None:
        self.policy, self.max_len, self.capacity = policy, max_len, budget_tokens
        self.heap = FirstFitAllocator(budget_tokens)
        self.starts: dict[int, int] = {}

    def need(self, final_len: int) -> int:
        """Slots a request that ends with ``final_len`` tokens must be able to own."""
        return reservation_tokens(self.policy, final_len, self.max_len)

    def admit(self, rid: int, length: int, final_len: int,
              others_running: bool) -> int | None:
        """Slots given to request ``rid`` now, or None if no hole is large enough."""
        size = self.need(final_len)
        start = self.heap.allocate(size)
        if start is None:
            return None
        self.starts[rid] = start
        return size

    def release(self, rid: int, owned: int) -> None:
        """Give back request ``rid``'s region."""
        self.heap.free(self.starts.pop(rid))

    def idle_split(self, idle: int, length: int, final_len: int,
                   others_running: bool) -> tuple[int, int, int]:
        """(external, headroom, blocked) slots of ``idle`` while a request of
        ``final_len`` waits: external if the free slots, in one piece, would hold it."""
        if self.heap.free_tokens >= self.need(final_len):
            return idle, 0, 0
        return 0, 0, idle


# %% chapters/02_fragmentation.md § The full simulator
class _PagedMemory:
    """Blocks of ``block_size`` slots, counted free or owned; any free block serves
    any request."""

    def __init__(self, budget_tokens: int, block_size: int, watermark: float) -> None:
        self.block_size = block_size
        self.free_blocks = budget_tokens // block_size
        self.capacity = self.free_blocks * block_size
        self.watermark_blocks = int(watermark * self.free_blocks)

    def need(self, final_len: int) -> int:
        """Slots a request that ends with ``final_len`` tokens owns at its end."""
        return ceil_div(final_len, self.block_size) * self.block_size

    def admit(self, rid: int, length: int, final_len: int,
              others_running: bool) -> int | None:
        """Blocks for the ``length`` tokens a request holds, if the watermark stays
        free."""
        blocks = ceil_div(length, self.block_size)
        if blocks > self.free_blocks - (self.watermark_blocks if others_running else 0):
            return None
        self.free_blocks -= blocks
        return blocks * self.block_size

    def grow(self) -> bool:
        """Take one more block for a request whose last block is full; False if none
        is free."""
        if self.free_blocks == 0:
            return False
        self.free_blocks -= 1
        return True

    def release(self, rid: int, owned: int) -> None:
        """Give back the blocks behind ``owned`` slots."""
        self.free_blocks += owned // self.block_size

    def idle_split(self, idle: int, length: int, final_len: int,
                   others_running: bool) -> tuple[int, int, int]:
        """(external, headroom, blocked) slots of ``idle``: paging never fragments; the
        watermark's blocks are headroom, the rest too few for the waiting prompt."""
        kept = min(self.free_blocks, self.watermark_blocks if others_running else 0)
        return 0, kept * self.block_size, idle - kept * self.block_size


# %% chapters/02_fragmentation.md § The full simulator
class _Simulation:
    """The state of one ``simulate`` run: queue, running requests, lengths, records."""

    def __init__(self, requests: list[TraceRequest], memory, budget_tokens: int,
                 max_len: int, max_running: int | None) -> None:
        requests = sorted(requests, key=lambda r: r.arrival)
        self.n = len(requests)
        self.arrival = np.array([r.arrival for r in requests], dtype=float)
        # tokens stored (kept across a preemption: recomputed on readmission)
        self.length = np.array([min(r.prompt_len, max_len) for r in requests],
                               dtype=np.int64)
        self.final = np.array([min(r.total_len, max_len) for r in requests],
                              dtype=np.int64)
        self.truncated = sum(r.total_len > max_len for r in requests)
        # reservation, or blocks * block_size
        self.owned = np.zeros(self.n, dtype=np.int64)
        self.memory, self.budget, self.max_running = memory, budget_tokens, max_running
        self.waiting: deque[int] = deque()
        self.running: list[int] = []  # in admission order
        self.records: dict[str, list[int]] = {name: [] for name in ("steps",) + _SERIES}
        self.next_arrival = self.finished = self.step = 0
        self.generated = self.preemptions = 0

    def run(self) -> None:
        """Step until every request has finished."""
        while self.finished < self.n:
            self._arrive()
            self._decode()
            head = self._admit()
            if self.waiting and not self.running:
                raise RuntimeError(
                    f"step {self.step}: no request runs and request "
                    f"{self.waiting[0]} cannot be admitted into an empty budget; "
                    "the allocator lost memory")
            self._record(head)
            self._finish()
            self.step += 1

    # %% chapters/02_fragmentation.md § The full simulator
    def _arrive(self) -> None:
        """Queue the requests that have arrived; skip idle time to the next arrival."""
        idle = not self.running and not self.waiting
        if idle and self.arrival[self.next_arrival] > self.step:
            self.step = int(math.ceil(self.arrival[self.next_arrival]))
        while self.next_arrival < self.n and self.arrival[self.next_arrival] <= self.step:
            self.waiting.append(self.next_arrival)
            self.next_arrival += 1

    # %% chapters/02_fragmentation.md § The full simulator
    def _decode(self) -> None:
        """Store one token per running request; grow paged ones, preempting if needed."""
        if not self.running:
            return
        ids = np.asarray(self.running)
        self.length[ids] += 1
        self.generated += len(ids)
        # only paged ones outgrow
        for rid in ids[self.length[ids] > self.owned[ids]].tolist():
            while rid in self.running and not self.memory.grow():
                self._preempt(self.running.pop())  # no free block: the latest admitted goes
            if rid in self.running:
                self.owned[rid] += self.memory.block_size

    def _preempt(self, victim: int) -> None:
        """Free ``victim``'s memory and put it back at the head of the queue."""
        self.memory.release(victim, int(self.owned[victim]))
        self.owned[victim] = 0
        self.length[victim] -= 1  # its token of this step was not computed
        self.generated -= 1
        self.waiting.appendleft(victim)
        self.preemptions += 1

    # %% chapters/02_fragmentation.md § The full simulator
    def _admit(self) -> int | None:
        """Admit from the head of the queue; the head memory refused, or None."""
        while self.waiting:
            if self.max_running is not None and len(self.running) >= self.max_running:
                return None
            rid = self.waiting[0]
            size = self.memory.admit(rid, int(self.length[rid]), int(self.final[rid]),
                                     bool(self.running))
            if size is None:
                return rid
            self.owned[rid] = size
            self.running.append(self.waiting.popleft())
        return None

    # %% chapters/02_fragmentation.md § The full simulator
    def _record(self, head: int | None) -> None:
        """Append this step's slot states, running and waiting counts to the records."""
        ids = np.asarray(self.running, dtype=np.int64)
        stored, mine, ends = self.length[ids], self.owned[ids], self.final[ids]
        usable = np.minimum(mine, ends)
        idle = self.budget - int(mine.sum())
        external = headroom = blocked = 0
        if head is not None:
            external, headroom, blocked = self.memory.idle_split(
                idle, int(self.length[head]), int(self.final[head]), bool(self.running))
        row = {"steps": self.step, "token_states": int(stored.sum()),
               "reservation": int((usable - stored).sum()),
               "internal": int((mine - usable).sum()),
               "external": external, "headroom": headroom, "blocked": blocked,
               "free": idle if head is None else 0,
               "running": len(self.running), "waiting": len(self.waiting)}
        for name, value in row.items():
            self.records[name].append(value)

    def _finish(self) -> None:
        """Release the requests that stored their final token."""
        ids = np.asarray(self.running, dtype=np.int64)
        done = ids[self.length[ids] >= self.final[ids]].tolist()
        for rid in done:
            self.memory.release(rid, int(self.owned[rid]))
            self.owned[rid] = 0
        if done:
            self.finished += len(done)
            done_set = set(done)
            self.running = [rid for rid in self.running if rid not in done_set]


# %% chapters/02_fragmentation.md § The full simulator
def simulate(requests: list[TraceRequest], policy: str = "paged",
             budget_tokens: int = 16384, *, block_size: int = 16, max_len: int = 2048,
             max_running: int | None = None,
             watermark: float = 0.01) -> SimulationResult:
    """Replay ``requests`` against a KV budget of ``budget_tokens`` under ``policy``.

    One step: arrivals join the queue; running requests store one token each
    (``paged`` allocates a block when one is full, preempting the latest admitted
    request if none is free); waiting requests are admitted first come, first served,
    while memory (and ``max_running``) allows; the state of every slot is recorded;
    requests that reached their final length finish and free their memory. Lengths
    above ``max_len`` are truncated. Under ``paged``, a request is admitted only if
    ``watermark`` (a fraction of all blocks) stays free after its prompt's blocks
    (vLLM's default: 0.01).
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose one of {POLICIES}")
    if budget_tokens <= 0 or block_size <= 0 or max_len <= 0:
        raise ValueError("budget_tokens, block_size and max_len must be positive, got "
                         f"{budget_tokens}, {block_size}, {max_len}")
    if max_running is not None and max_running < 1:
        raise ValueError(f"max_running must be at least 1 (or None), got {max_running}")
    paged = policy == "paged"
    memory = (_PagedMemory(budget_tokens, block_size, watermark) if paged
              else _ContiguousMemory(policy, budget_tokens, max_len))
    need_most = max((memory.need(min(r.total_len, max_len)) for r in requests),
                    default=0)
    if need_most > memory.capacity:
        raise ValueError(f"a request needs {need_most} tokens under {policy!r} but "
                         f"only {memory.capacity} fit in the budget: raise "
                         "budget_tokens or lower max_len")
    run = _Simulation(requests, memory, budget_tokens, max_len, max_running)
    run.run()
    arrays = {name: np.asarray(values, dtype=np.int64)
              for name, values in run.records.items()}
    return SimulationResult(policy, budget_tokens, block_size if paged else None,
                            max_len, run.n, generated_tokens=run.generated,
                            preemptions=run.preemptions, truncated=int(run.truncated),
                            **arrays)
