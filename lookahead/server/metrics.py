"""Prometheus metrics, labelled by request class and strategy, in a registry of the app's own."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
UNLABELLED = "default"  # requests that name no class
OTHER = "other"  # classes beyond max_class_labels


class ServerMetrics:
    """All the server's counters. Thread-safe: the model worker records, the event loop reads."""

    def __init__(
        self,
        *,
        price_per_hour_usd: float,
        known_classes: Iterable[str],
        max_class_labels: int,
        queue_depth: Callable[[], float],
        in_flight: Callable[[], float],
    ) -> None:
        self.price_per_hour_usd = price_per_hour_usd
        self._known = frozenset(known_classes)
        self._extra: set[str] = set()
        self._max_extra = max_class_labels
        self._lock = threading.Lock()
        r = self.registry = CollectorRegistry(auto_describe=True)
        cs = ("request_class", "strategy")
        self.requests = Counter(
            "lookahead_requests", "Requests that reached the model worker, by outcome", (*cs, "status"), registry=r
        )
        self.generated_tokens = Counter("lookahead_generated_tokens", "Completion tokens generated", cs, registry=r)
        self.decode_steps = Counter(
            "lookahead_decode_steps", "Decoding steps (forward passes after prefill)", cs, registry=r
        )
        self.accepted_guesses = Counter(
            "lookahead_accepted_guesses", "Speculated tokens accepted by verification", cs, registry=r
        )
        self.device_seconds = Counter(
            "lookahead_device_seconds", "Seconds the model worker spent on requests", cs, registry=r
        )
        self.cost_usd = Counter("lookahead_cost_usd", "device_seconds * price per device-hour / 3600", cs, registry=r)
        self.latency = Histogram(
            "lookahead_request_latency_seconds", "Arrival to last token", cs, buckets=LATENCY_BUCKETS, registry=r
        )
        self.ttft = Histogram(
            "lookahead_time_to_first_token_seconds", "Arrival to first token", cs, buckets=TTFT_BUCKETS, registry=r
        )
        self.rejected = Counter(
            "lookahead_rejected_requests",
            "Requests refused before reaching the model",
            ("request_class", "reason"),
            registry=r,
        )
        queue = Gauge("lookahead_queue_depth", "Requests waiting for the model worker", registry=r)
        queue.set_function(queue_depth)
        busy = Gauge("lookahead_in_flight", "Requests being generated now (the batch)", registry=r)
        busy.set_function(in_flight)
        # Continuous batching (server/batch_worker.py): what each decoding pass carried.
        self.batch_size = Gauge("lookahead_batch_size", "Requests in the last decoding pass", registry=r)
        self.batch_steps = Counter("lookahead_batch_steps", "Decoding passes of the batched worker", registry=r)
        self.step_rows = Counter("lookahead_step_rows", "Query rows over all decoding passes (padding included)",
                                 registry=r)
        self.speculative_rows = Counter(
            "lookahead_speculative_rows", "Rows granted to guesses and the Jacobi window over all passes", registry=r
        )
        self.kv_tokens = Gauge("lookahead_kv_tokens", "Tokens held in the KV cache by requests in flight", registry=r)
        price = Gauge("lookahead_price_per_device_hour_usd", "The --price-per-hour in force", registry=r)
        price.set(price_per_hour_usd)
        self.ngram_cache_bytes = Gauge(
            "lookahead_ngram_cache_bytes", "Approximate memory of a class's cross-request n-gram cache",
            ("request_class",), registry=r,
        )
        self.prefix_cache_bytes = Gauge(
            "lookahead_prefix_cache_bytes", "Keys and values of prompt prefixes kept for reuse", registry=r)
        self.prefix_cache_reused = Gauge(
            "lookahead_prefix_cache_reused_tokens", "Prompt tokens taken from the prefix cache since start "
            "(not prefilled)", registry=r)
        self.ngram_cache_entries = Gauge(
            "lookahead_ngram_cache_entries", "Entries in a class's cross-request n-gram cache",
            ("request_class",), registry=r,
        )

    def prefix_cache(self, stats: dict[str, int]) -> None:
        self.prefix_cache_bytes.set(stats["bytes"])
        self.prefix_cache_reused.set(stats["reused_tokens"])

    def ngram_cache(self, label: str, memory: dict[str, int]) -> None:
        self.ngram_cache_bytes.labels(label).set(memory["bytes"])
        self.ngram_cache_entries.labels(label).set(memory["entries"])

    def class_label(self, request_class: str | None, *, register: bool = True) -> str:
        """A bounded label: the policy's classes, then up to max_class_labels others, then 'other'.
        register=False (for refused requests) never takes up one of the free slots."""
        if request_class is None:
            return UNLABELLED
        if request_class in self._known:
            return request_class
        with self._lock:
            if request_class in self._extra:
                return request_class
            if register and len(self._extra) < self._max_extra:
                self._extra.add(request_class)
                return request_class
        return OTHER

    def cost(self, device_seconds: float) -> float:
        return device_seconds * self.price_per_hour_usd / 3600.0

    def reject(self, label: str, reason: str) -> None:
        self.rejected.labels(label, reason).inc()

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
