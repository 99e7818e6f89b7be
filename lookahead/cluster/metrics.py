"""Per-replica metrics through Ray's metrics export, under the single-process server's names.

Each engine replica keeps its ServerMetrics (a prometheus_client registry, lookahead/server/metrics.py)
and, every `interval_s`, copies every sample into a Ray gauge tagged with the replica's id
(`RayMetricsExporter`). Ray exports them on each node's metrics port as `ray_<name>` with Ray's own
labels. `cluster_metrics_text` reads every node's export and gives them back as the server writes
them: the same names (`lookahead_requests_total`, ...), the same labels, plus `replica`.
Counters and histograms arrive as gauges that carry the cumulative value (Ray has no way to set a
counter); the values are those of the replica's own /metrics, a few seconds late.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable
from typing import Any

log = logging.getLogger("lookahead.cluster")

RAY_PREFIX = "ray_"
_RAY_LABELS = frozenset({"Component", "NodeAddress", "SessionName", "Version", "WorkerId", "JobId", "ActorId"})
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


class RayMetricsExporter:
    """Copies a prometheus_client registry into Ray gauges, tagged replica=<id>, every interval_s."""

    def __init__(self, registry: Any, replica: str, *, interval_s: float = 2.0, prefix: str = "lookahead_") -> None:
        self._registry = registry
        self._replica = replica
        self._interval = interval_s
        self._prefix = prefix
        self._gauges: dict[str, Any] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lookahead-ray-metrics", daemon=True)

    def start(self) -> None:
        self.export_once()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._interval + 1)
        self.export_once()  # the last values, so a scrape after the replica drained still sees them

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.export_once()
            except Exception:  # a metrics hiccup must never take the replica down
                log.exception("could not export metrics to Ray")

    def export_once(self) -> None:
        from ray.util.metrics import Gauge

        for family in self._registry.collect():
            for sample in family.samples:
                if not sample.name.startswith(self._prefix) or sample.name.endswith("_created"):
                    continue
                keys = tuple(sorted(sample.labels))
                gauge = self._gauges.get(sample.name)
                if gauge is None:
                    gauge = Gauge(sample.name, description=family.documentation or sample.name,
                                  tag_keys=(*keys, "replica"))
                    self._gauges[sample.name] = gauge
                gauge.set(float(sample.value), tags={**sample.labels, "replica": self._replica})


def node_metrics_urls(nodes: Iterable[dict[str, Any]]) -> list[str]:
    """The Prometheus export URL of every alive node in `ray.nodes()`."""
    return [f"http://{n['NodeManagerAddress']}:{n['MetricsExportPort']}/metrics"
            for n in nodes if n.get("Alive") and n.get("MetricsExportPort")]


def lookahead_samples(text: str, prefix: str = "lookahead_") -> list[str]:
    """From one node's Ray export: our samples, renamed back (ray_lookahead_x -> lookahead_x), with Ray's
    own labels (worker, node, session, OpenTelemetry scope) dropped, sorted."""
    out: list[str] = []
    for line in text.splitlines():
        if not line.startswith(RAY_PREFIX + prefix):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        labels = [(k, v) for k, v in _LABEL.findall(match["labels"] or "")
                  if k not in _RAY_LABELS and not k.startswith("otel_")]
        inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels))
        name = match["name"].removeprefix(RAY_PREFIX)
        out.append(f"{name}{{{inner}}} {match['value']}" if inner else f"{name} {match['value']}")
    return sorted(out)


def cluster_metrics_text(urls: Iterable[str], *, timeout_s: float = 3.0) -> str:
    """Every node's lookahead samples, one text in Prometheus' exposition format (unreachable nodes are
    named in a comment, not fatal: the other nodes' numbers still count)."""
    import httpx

    lines: list[str] = []
    for url in urls:
        try:
            response = httpx.get(url, timeout=timeout_s)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            lines.append(f"# node export {url} unreachable: {type(exc).__name__}")
            continue
        lines.extend(lookahead_samples(response.text))
    return "\n".join(lines) + "\n"
