"""Loopback load test of `lookahead serve`: N concurrent streaming clients, mixed request classes.

For each server mode it starts a server process on 127.0.0.1, then for each concurrency level N runs
N clients for --duration seconds, each sending streaming chat requests drawn round-robin from a
mixed-class workload. Modes:

    serial      lookahead policy, --max-batch 1: one request at a time (the server before batching)
    batched-ar  autoregressive policy, --max-batch B: plain continuous batching
    batched     lookahead policy, --max-batch B: continuous batching with the allocator deciding,
                step by step, how many rows go to speculation across the batch
    off         autoregressive policy, --max-batch 1 (one request at a time, no speculation)

It reports p50/p95 latency and time to first token, completion tokens/s (all clients together),
device-seconds per request (from the server's metrics), the mean batch and rows per pass, 429s, and
the server's RSS before and after the run.

    python benchmarks/server_load.py                                  # SmolLM2, N = 1,2,4,8,16, 60 s each
    python benchmarks/server_load.py --model tiny:llama --duration 3  # a seconds-long smoke run
    python benchmarks/server_load.py --policy policy.json             # the lookahead modes use the cost report's policy
    python benchmarks/server_load.py --concurrency none --soak 500     # memory soak only

--soak N sends N more short requests per policy (4 clients; every 10th a streaming client that hangs
up after its first chunk) and samples the server's RSS every 100 completions, to show that memory
settles instead of growing with the request count.

Results go to stdout as a table and, with --out, as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from loadgen import (  # noqa: E402
    POLICY_OFF, POLICY_ON, WORKLOAD, RunResult, fmt, free_port, one_request, rss_mb, run_clients, scrape, summarize,
    wait_healthy, with_metrics,
)

from lookahead.policy import dump_policy, load_policy  # noqa: E402


class Server:
    """A `python -m lookahead.server` process on a free loopback port."""

    def __init__(self, model: str, policy_file: Path, max_queue: int, log: Path, max_batch: int = 1) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lookahead.server",
                "--model",
                model,
                "--port",
                str(self.port),
                "--policy",
                str(policy_file),
                "--max-queue",
                str(max_queue),
                "--max-batch",
                str(max_batch),
                "--client-overrides",  # the soak forces lookahead on short requests the policy pins to AR
                "on",
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        self.model = wait_healthy(self.proc, self.url, log, 600)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(120)
        self._log.close()
        return code


def abandon_stream(http: httpx.Client, model: str, item: tuple[str, str, int], seed: int) -> int:
    """Start a streaming request and hang up after the first chunk (the server must cancel it)."""
    cls, prompt, _ = item
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 64,
            "temperature": 0, "seed": seed, "stream": True, "metadata": {"request_class": cls}}
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code == 200:
            next(r.iter_lines(), None)
        return r.status_code


def soak(server: Server, total: int, max_tokens: int, extra: dict[str, Any], clients: int = 4) -> dict[str, Any]:
    """`total` short requests from `clients` threads; RSS sampled every 100 completions. `extra` is
    merged into each request body (the lookahead modes ask for lookahead even below the policy's short-request
    threshold, so the soak exercises its buffers)."""
    done = 0
    statuses: dict[int, int] = {}
    trace: list[tuple[int, float]] = [(0, rss_mb(server.proc.pid))]
    lock = threading.Lock()
    t0 = time.monotonic()

    def client(index: int) -> None:
        nonlocal done
        with httpx.Client(base_url=server.url, timeout=600) as http:
            while True:
                with lock:
                    if done >= total:
                        return
                    done += 1
                    i = done
                cls, prompt, _ = WORKLOAD[i % len(WORKLOAD)]
                try:
                    if i % 10 == 0:
                        status = abandon_stream(http, server.model, (cls, prompt, max_tokens), seed=i)
                    else:
                        item = (cls, prompt, max_tokens)
                        status = one_request(http, server.model, item, seed=i, extra=extra).status
                except (httpx.HTTPError, ValueError):  # a dead server or a broken stream: counted, not hidden
                    status = -1
                with lock:
                    statuses[status] = statuses.get(status, 0) + 1
                    if i % 100 == 0:
                        trace.append((i, rss_mb(server.proc.pid)))
                if status == 429:
                    time.sleep(0.25)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    alive = server.proc.poll() is None
    trace.append((total, rss_mb(server.proc.pid) if alive else float("nan")))
    after_warmup = [mb for n, mb in trace if n >= 100] or [trace[-1][1]]
    return {
        "requests": total, "max_tokens": max_tokens, "clients": clients, "seconds": round(time.monotonic() - t0, 1),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},  # -1: transport error
        "server_alive": alive,
        "rss_trace_mb": [[n, round(mb, 1)] for n, mb in trace],
        "rss_growth_after_100_mb": round(after_warmup[-1] - after_warmup[0], 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct", help="model to serve (tiny:llama for a smoke run)")
    p.add_argument("--concurrency", default="1,2,4,8,16", help="comma-separated client counts (default 1,2,4,8,16)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds per concurrency level (default 60)")
    p.add_argument("--max-queue", type=int, default=8, help="server --max-queue (default 8: N=16 sees 429s)")
    p.add_argument("--policy", help="policy file for the lookahead modes (default: a built-in lookahead policy)")
    p.add_argument("--modes", default="serial,batched-ar,batched", help="comma-separated server modes: "
                   "serial, batched-ar, batched, off (default serial,batched-ar,batched)")
    p.add_argument("--max-batch", type=int, default=16, help="--max-batch of the batched modes (default 16)")
    p.add_argument("--soak", type=int, default=0, metavar="N", help="then N short requests for the RSS soak")
    p.add_argument("--soak-max-tokens", type=int, default=8, help="max_tokens of soak requests (default 8)")
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args(argv)
    try:
        no_levels = args.concurrency.strip().lower() == "none"
        levels = [] if no_levels else [int(n) for n in args.concurrency.split(",")]
        if (not levels and not no_levels) or (levels and min(levels) < 1) or args.duration <= 0:
            raise ValueError
        if args.soak < 0 or args.soak_max_tokens < 1 or (no_levels and not args.soak):
            raise ValueError
    except ValueError:
        print("error: --concurrency must be positive integers like 1,4,16 (or none, with --soak N), "
              "--duration > 0, --soak >= 0 and --soak-max-tokens >= 1", file=sys.stderr)
        return 2
    on = load_policy(args.policy) if args.policy else POLICY_ON
    known = {"serial": (on, 1), "batched-ar": (POLICY_OFF, args.max_batch), "batched": (on, args.max_batch),
             "off": (POLICY_OFF, 1)}
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - set(known) or args.max_batch < 1:
        print(f"error: --modes takes {', '.join(known)}; --max-batch >= 1", file=sys.stderr)
        return 2
    results: list[RunResult] = []
    soaks: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in modes:
            policy, max_batch = known[name]
            policy_file = Path(tmp) / f"policy-{name}.json"
            dump_policy(policy, policy_file)
            server = Server(args.model, policy_file, args.max_queue, Path(tmp) / f"server-{name}.log", max_batch)
            try:
                one_request(
                    httpx.Client(base_url=server.url, timeout=600), server.model, WORKLOAD[0], seed=0
                )  # warm-up
                for n in levels:
                    before, counted = rss_mb(server.proc.pid), scrape(server.url)
                    samples, wall = run_clients(server, n, args.duration)
                    results.append(with_metrics(summarize(name, n, samples, wall, (before, rss_mb(server.proc.pid))),
                                                counted, scrape(server.url)))
                    r = results[-1]
                    print(
                        f"mode {name:10s} N={n:<3d} requests={r.requests:<5d} p50={fmt(r.latency_p50_s)}s "
                        f"tok/s={r.tokens_per_s:.1f} dev-s/req={fmt(r.device_s_per_request)} batch={r.mean_batch} "
                        f"rows={r.rows_per_pass} 429={r.rejected_429} rss={r.rss_before_mb}->{r.rss_after_mb} MB",
                        file=sys.stderr,
                        flush=True,
                    )
                if args.soak:
                    extra = {"lookahead": {"enabled": True}} if name in ("serial", "batched") else {}
                    soaks[name] = soak(server, args.soak, args.soak_max_tokens, extra)
                    print(f"mode {name} soak: {json.dumps(soaks[name])}", file=sys.stderr, flush=True)
            finally:
                code = server.stop()
                if code != 0:
                    print(f"warning: server exited with {code} after SIGTERM", file=sys.stderr)
    if results:
        print(
            "| mode | N | requests | ok | 429 | errors | p50 latency s | p95 latency s | p50 TTFT s | p95 TTFT s "
            "| tokens/s | device-s/request | batch | rows/pass | spec rows/pass | RSS after MB |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r.policy} | {r.concurrency} | {r.requests} | {r.ok} | {r.rejected_429} | {r.errors} | "
            f"{fmt(r.latency_p50_s)} | {fmt(r.latency_p95_s)} | {fmt(r.ttft_p50_s)} | {fmt(r.ttft_p95_s)} | "
            f"{r.tokens_per_s:.1f} | {fmt(r.device_s_per_request)} | {r.mean_batch or '-'} | {r.rows_per_pass or '-'} | "
            f"{r.speculative_rows_per_pass if r.speculative_rows_per_pass is not None else '-'} | {r.rss_after_mb} |"
        )
    print(json.dumps({"model": args.model, "modes": modes, "max_batch": args.max_batch,
                      "tokens_per_s": {f"{r.policy}@{r.concurrency}": round(r.tokens_per_s, 2) for r in results}}))
    for name, sk in soaks.items():
        trace = ", ".join(f"{n}: {mb}" for n, mb in sk["rss_trace_mb"])
        print(f"\nsoak, mode {name}: {sk['requests']} requests in {sk['seconds']} s, statuses {sk['statuses']}; "
              f"RSS MB by completed requests {{{trace}}}; growth after request 100: {sk['rss_growth_after_100_mb']} MB")
    if args.out:
        Path(args.out).write_text(
            json.dumps({"model": args.model, "results": [asdict(r) for r in results], "soak": soaks}, indent=2) + "\n"
        )
    bad_soak = any(set(sk["statuses"]) - {"200", "429"} or not sk["server_alive"] for sk in soaks.values())
    return 1 if any(r.errors for r in results) or bad_soak else 0


if __name__ == "__main__":
    sys.exit(main())
