# GENERATED from chapters/17_openai_server.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/17_openai_server.md § What to measure
"""Prometheus metrics of a server, with vLLM's names under the ``minipaged:`` prefix."""

from __future__ import annotations

from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["ServerMetrics", "LATENCY_BUCKETS", "render_metrics"]

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                   2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
"""Seconds: fine below a second (GPU latencies), coarse up to minutes (CPU runs)."""


class ServerMetrics:
    """Every metric of one server in its own registry; ``observe`` runs after every step
    where the engine steps (the loop's thread, or the core process), and so does
    ``render``, the text ``/metrics`` serves."""

    def __init__(self, model_name: str, prefix: str = "minipaged") -> None:
        self.registry = r = CollectorRegistry()
        name = [model_name]

        def make(kind, metric, doc, **extra):
            return kind(f"{prefix}:{metric}", doc, ["model_name"], registry=r, **extra)

        self.running = make(Gauge, "num_requests_running", "Requests in the running batch.")
        self.waiting = make(Gauge, "num_requests_waiting", "Requests waiting to be admitted.")
        self.kv_usage = make(Gauge, "kv_cache_usage_perc",
                             "Share of KV blocks in use (1 = full).")
        self.queries = make(Counter, "prefix_cache_queries", "Prompt tokens looked up.")
        self.hits = make(Counter, "prefix_cache_hits", "Prompt tokens found cached.")
        self.preemptions = make(Counter, "num_preemptions", "Sequences preempted.")
        self.prompt_tokens = make(Counter, "prompt_tokens", "Prompt tokens of finished requests.")
        self.generation_tokens = make(Counter, "generation_tokens", "Tokens generated.")
        self.ttft = make(Histogram, "time_to_first_token_seconds", "Arrival to first token.",
                         buckets=LATENCY_BUCKETS)
        self.tpot = make(Histogram, "time_per_output_token_seconds",
                         "Mean gap between output tokens of a request.", buckets=LATENCY_BUCKETS)
        self.e2e = make(Histogram, "e2e_request_latency_seconds", "Arrival to finish.",
                        buckets=LATENCY_BUCKETS)
        self.success = Counter(f"{prefix}:request_success", "Finished requests.",
                               ["model_name", "finished_reason"], registry=r)
        self.model_name = model_name
        self._gauges = [m.labels(*name) for m in (self.running, self.waiting, self.kv_usage)]
        self._tokens = self.generation_tokens.labels(*name)  # labels() takes a lock: once
        self._seen = {"preemptions": 0, "queries": 0, "hits": 0}
        self.recent_ttft: deque[float] = deque(maxlen=64)  # for the dashboard
        self.recent_tpot: deque[float] = deque(maxlen=64)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # %% chapters/17_openai_server.md § What to measure
    def observe(self, stats, progress) -> None:
        """Update every metric after a step from the engine's ``EngineStats`` and the step's
        progress (called by whoever owns the engine: its loop thread, or the core process)."""
        name = self.model_name
        running, waiting, usage = self._gauges
        running.set(stats.num_running)
        waiting.set(stats.num_waiting)
        usage.set(stats.kv_cache_usage)
        for key, counter, value in (
                ("preemptions", self.preemptions, stats.num_preemptions),
                ("queries", self.queries, stats.prefix_cache_queries),
                ("hits", self.hits, stats.prefix_cache_hits)):
            if value > self._seen[key]:  # counters only grow
                counter.labels(name).inc(value - self._seen[key])
            self._seen[key] = value
        self._tokens.inc(sum(d.num_new_tokens for update in progress for d in update.deltas))
        for update in progress:
            if update.finished:
                self._finished(update)

    def _finished(self, update) -> None:
        name, m = self.model_name, update.metrics or {}
        reasons = [d.finish_reason for d in update.deltas if d.finish_reason] or ["stop"]
        self.success.labels(name, reasons[0]).inc()
        self.prompt_tokens.labels(name).inc(update.num_prompt_tokens)
        arrival, first, done = m.get("arrival_time"), m.get("first_token_time"), m.get("finish_time")
        if arrival is None or first is None:
            return
        self.ttft.labels(name).observe(first - arrival)
        self.recent_ttft.append(first - arrival)
        if done and done >= first:
            self.e2e.labels(name).observe(done - arrival)
            if update.longest_sample > 1:
                tpot = (done - first) / (update.longest_sample - 1)
                self.tpot.labels(name).observe(tpot)
                self.recent_tpot.append(tpot)


# %% chapters/17_openai_server.md § What to measure
def render_metrics(owner) -> bytes:
    """``/metrics``'s text, made where the engine steps and the metrics are kept (``await
    owner.call(render_metrics)``): the engine core process, or the engine loop's thread."""
    return owner.metrics.render()
