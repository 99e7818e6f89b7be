"""The client side of the HTTP load benchmarks (server_load.py, cluster_load.py): a mixed-class
streaming workload, closed-loop clients, per-level summaries and the server's counters from /metrics.
"""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from lookahead.config import LookaheadConfig
from lookahead.policy import Decision, Policy, Rule

# (class, prompt, max_tokens): code and structured text repeat themselves (lookahead's best case),
# open chat less so, and short requests sit under the policy's autoregressive threshold.
WORKLOAD: list[tuple[str, str, int]] = [
    ("code", "Write a Python function that returns the n-th Fibonacci number, with a docstring.", 96),
    ("chat", "Explain in a few sentences why the sky is blue.", 64),
    ("code", "Write a SQL query that counts orders per customer, highest first.", 64),
    ("extract", "List the weekdays, one per line.", 48),
    ("short", "Say hello.", 12),
    ("chat", "Give me three tips for a good night's sleep.", 64),
]

POLICY_ON = Policy(
    default=Decision("lookahead", LookaheadConfig()),
    classes={"code": Decision("lookahead", LookaheadConfig(window=4, ngram=4, guesses=4))},
    rules=(Rule(Decision("autoregressive"), max_tokens_below=16),),
    meta={"written_by": "benchmarks/server_load.py", "purpose": "lookahead on"},
)
POLICY_OFF = Policy(
    default=Decision("autoregressive"), meta={"written_by": "benchmarks/server_load.py", "purpose": "lookahead off"}
)


@dataclass
class Sample:
    request_class: str
    status: int
    latency_s: float
    ttft_s: float | None = None
    completion_tokens: int = 0
    strategy: str = ""


@dataclass
class RunResult:
    policy: str
    concurrency: int
    duration_s: float
    requests: int
    ok: int
    rejected_429: int
    errors: int
    latency_p50_s: float | None
    latency_p95_s: float | None
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    tokens_per_s: float
    rss_before_mb: float
    rss_after_mb: float
    device_s_per_request: float | None = None
    mean_batch: float | None = None
    rows_per_pass: float | None = None
    speculative_rows_per_pass: float | None = None
    by_class: dict[str, dict[str, Any]] = field(default_factory=dict)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def wait_healthy(proc: subprocess.Popen[Any], url: str, log: Path, timeout_s: float) -> str:
    """Wait until the server at `url` answers /health with 200; returns the model id it serves. Exits
    with a message naming the log when the process dies or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"error: the server exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"error: the server did not start within {timeout_s:.0f} s; see {log}")
        time.sleep(0.2)
    return str(httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"])


def one_request(
    http: httpx.Client, model: str, item: tuple[str, str, int], seed: int, extra: dict[str, Any] | None = None
) -> Sample:
    cls, prompt, max_tokens = item
    body: dict[str, Any] = {
        **(extra or {}),
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
        "metadata": {"request_class": cls},
    }
    t0 = time.perf_counter()
    ttft = None
    usage: dict[str, Any] = {}
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            r.read()
            return Sample(cls, r.status_code, time.perf_counter() - t0)
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                return Sample(cls, 599, time.perf_counter() - t0)
            if ttft is None and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                ttft = time.perf_counter() - t0
            if chunk.get("usage"):
                usage = chunk["usage"]
    return Sample(
        cls,
        200,
        time.perf_counter() - t0,
        ttft,
        int(usage.get("completion_tokens", 0)),
        str(usage.get("lookahead", {}).get("strategy", "")),
    )


def run_clients(server: Server, concurrency: int, duration_s: float) -> tuple[list[Sample], float]:
    samples: list[Sample] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + duration_s

    def client(index: int) -> None:
        with httpx.Client(base_url=server.url, timeout=600) as http:
            i = index
            while time.monotonic() < stop_at:
                s = one_request(http, server.model, WORKLOAD[i % len(WORKLOAD)], seed=i)
                with lock:
                    samples.append(s)
                if s.status == 429:
                    time.sleep(0.25)  # back off a little (Retry-After is the server's worst-case estimate)
                i += concurrency

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return samples, time.monotonic() - t0


def summarize(
    policy: str, concurrency: int, samples: list[Sample], wall_s: float, rss: tuple[float, float]
) -> RunResult:
    ok = [s for s in samples if s.status == 200]
    lat = [s.latency_s for s in ok]
    ttft = [s.ttft_s for s in ok if s.ttft_s is not None]
    by_class: dict[str, dict[str, Any]] = {}
    for cls in sorted({s.request_class for s in ok}):
        mine = [s for s in ok if s.request_class == cls]
        by_class[cls] = {
            "requests": len(mine),
            "latency_p50_s": percentile([s.latency_s for s in mine], 50),
            "strategies": sorted({s.strategy for s in mine}),
        }
    return RunResult(
        policy=policy,
        concurrency=concurrency,
        duration_s=round(wall_s, 2),
        requests=len(samples),
        ok=len(ok),
        rejected_429=sum(s.status == 429 for s in samples),
        errors=sum(s.status not in (200, 429) for s in samples),
        latency_p50_s=percentile(lat, 50),
        latency_p95_s=percentile(lat, 95),
        ttft_p50_s=percentile(ttft, 50),
        ttft_p95_s=percentile(ttft, 95),
        tokens_per_s=sum(s.completion_tokens for s in ok) / wall_s if wall_s > 0 else 0.0,
        rss_before_mb=round(rss[0], 1),
        rss_after_mb=round(rss[1], 1),
        by_class=by_class,
    )


def scrape(url: str) -> dict[str, float]:
    """Sums of the server's counters that the table reports (over all labels)."""
    names = {"lookahead_device_seconds_total": "device_s", "lookahead_requests_total": "requests",
             "lookahead_batch_steps_total": "passes", "lookahead_step_rows_total": "rows",
             "lookahead_speculative_rows_total": "speculative_rows", "lookahead_decode_steps_total": "request_steps"}
    out = dict.fromkeys(names.values(), 0.0)
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in names:
            out[names[name]] += float(line.split()[-1])
    return out


def with_metrics(r: RunResult, before: dict[str, float], after: dict[str, float]) -> RunResult:
    d = {k: after[k] - before[k] for k in after}
    if d["requests"]:
        r.device_s_per_request = round(d["device_s"] / d["requests"], 4)
    if d["passes"]:
        r.mean_batch = round(d["request_steps"] / d["passes"], 2)
        r.rows_per_pass = round(d["rows"] / d["passes"], 2)
        r.speculative_rows_per_pass = round(d["speculative_rows"] / d["passes"], 2)
    return r


def fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"
