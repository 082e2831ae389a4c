"""Prometheus metrics of the server (``GET /metrics``), kept in the main process.

Gauges come from the scheduler's per-step :class:`SchedulerSnapshot`; counters and latency
histograms from the tokenizer manager's view of each request. Latencies are in seconds.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from radixlm.runtime.server.io_struct import SchedulerSnapshot

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class ServerMetrics:
    """One registry per server instance (so tests can start several in one process)."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        r, labels = self.registry, ["model_name"]
        self._model = model_name

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"radixlm_{name}", doc, labels, registry=r).labels(model_name)

        def counter(name: str, doc: str) -> Counter:
            return Counter(f"radixlm_{name}", doc, labels, registry=r).labels(model_name)

        def hist(name: str, doc: str) -> Histogram:
            return Histogram(f"radixlm_{name}", doc, labels, buckets=_LATENCY_BUCKETS, registry=r).labels(model_name)

        self.num_running = gauge("num_running_reqs", "Requests running in the scheduler")
        self.num_queued = gauge("num_queue_reqs", "Requests waiting in the scheduler queue")
        self.token_usage = gauge("token_usage", "Share of KV slots held by requests (0..1)")
        self.kv_used = gauge("kv_used_tokens", "KV slots held by requests")
        self.cache_hit_rate = gauge("cache_hit_rate", "Prompt tokens served from the prefix cache / prompt tokens")
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of finished requests")
        self.generated_tokens = counter("generation_tokens", "Generated tokens of finished requests")
        self.cached_tokens = counter("cached_tokens", "Prompt tokens served from the prefix cache")
        self.requests = counter("requests", "Finished requests")
        self.aborted = counter("aborted_requests", "Requests that finished with an abort")
        self.retracted = counter("retracted_requests", "Requests preempted to free KV")
        self.ttft = hist("time_to_first_token_seconds", "Time to first token")
        self.itl = hist("inter_token_latency_seconds", "Time between output tokens")
        self.e2e = hist("e2e_request_latency_seconds", "End-to-end request latency")
        self.grammar_compile = hist("grammar_compile_seconds", "Grammar compile time (validation)")
        self._retracted_seen = 0
        self.spec = {k: counter(k, doc) for k, doc in (
            ("spec_verify_ct", "Speculative verify steps that carried a draft (per request)"),
            ("spec_draft_tokens", "Speculative draft tokens proposed"),
            ("spec_accepted_tokens", "Speculative draft tokens accepted"))}
        self.spec_accept_rate = gauge("spec_accept_rate", "Accepted / proposed speculative draft tokens")
        self._spec_seen = dict.fromkeys(self.spec, 0)

    def observe_snapshot(self, s: SchedulerSnapshot) -> None:
        self.num_running.set(s.num_running)
        self.num_queued.set(s.num_waiting)
        self.kv_used.set(s.kv_used_tokens)
        self.token_usage.set(s.kv_used_tokens / max(s.kv_total_tokens, 1))
        self.cache_hit_rate.set(s.cache_hit_rate)
        if s.num_retracted > self._retracted_seen:
            self.retracted.inc(s.num_retracted - self._retracted_seen)
            self._retracted_seen = s.num_retracted
        for k, c in self.spec.items():
            v = getattr(s, k, 0)
            if v > self._spec_seen[k]:
                c.inc(v - self._spec_seen[k])
                self._spec_seen[k] = v
        if s.spec_draft_tokens:
            self.spec_accept_rate.set(s.spec_accepted_tokens / s.spec_draft_tokens)

    def observe_finish(self, prompt: int, completion: int, cached: int, e2e_s: float, aborted: bool) -> None:
        self.requests.inc()
        self.prompt_tokens.inc(prompt)
        self.generated_tokens.inc(completion)
        self.cached_tokens.inc(cached)
        self.e2e.observe(e2e_s)
        if aborted:
            self.aborted.inc()

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
