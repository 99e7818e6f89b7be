"""Throughput of `lookahead serve --ray` with 1 and 2 replicas on this machine, beside the
single-process server: the same closed-loop streaming clients as benchmarks/server_load.py (benchmarks/loadgen.py).

    python benchmarks/cluster_load.py                           # SmolLM2, N = 1,4,8, 30 s each
    python benchmarks/cluster_load.py --model tiny:llama --duration 3 --concurrency 2   # smoke run

Modes (every server runs the lookahead policy of loadgen.py, batch up to --max-batch):
    single     `lookahead serve` (one process; default --threads: the cores less one)
    single-1t  the same with OMP_NUM_THREADS=1 (one torch thread)
    ray-1      `lookahead serve --ray --replicas 1` (one replica; default threads)
    ray-1-1t   the same with --threads-per-replica 1
    ray-2      `lookahead serve --ray --replicas 2` (two replicas, the cores split between them)
Modes run one after another (one local Ray instance at a time), levels within a mode in order; the
table reports tokens/s, latency, TTFT and device-seconds per request (from /metrics: under Ray,
every replica's metrics through Ray's export, summed).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from loadgen import POLICY_ON, fmt, free_port, run_clients, scrape, summarize, wait_healthy, with_metrics  # noqa: E402

from lookahead.policy import dump_policy  # noqa: E402

# mode -> (extra `serve` flags, extra environment); the *-1t modes pin one torch thread per process, to
# tell "two replicas" apart from "one thread per process" on a small machine.
MODES: dict[str, tuple[list[str], dict[str, str]]] = {
    "single": ([], {}),
    "single-1t": ([], {"OMP_NUM_THREADS": "1"}),
    "ray-1": (["--ray", "--replicas", "1"], {}),
    "ray-1-1t": (["--ray", "--replicas", "1", "--threads-per-replica", "1"], {}),
    "ray-2": (["--ray", "--replicas", "2"], {}),
}


class Process:
    """A `lookahead serve` process (with or without --ray) on a free loopback port."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = log.open("w")
        self.proc = subprocess.Popen([sys.executable, "-m", "lookahead.cli.main", "serve", *args,
                                      "--port", str(self.port), "--log-level", "warning"],
                                     cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
        self.model = wait_healthy(self.proc, self.url, log, 900)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(300)
        self._log.close()
        return code


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--modes", default="single,ray-1,ray-2")
    ap.add_argument("--concurrency", default="1,4,8")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds per level")
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--export-wait", type=float, default=6.0,
                    help="seconds to wait before reading /metrics (Ray exports every few seconds)")
    ap.add_argument("--out", default=None, help="folder for results.json and table.md")
    args = ap.parse_args(argv)
    levels = [int(x) for x in args.concurrency.split(",")]
    work = Path(args.out or "/tmp/cluster_load")
    work.mkdir(parents=True, exist_ok=True)
    policy_file = work / "policy.json"
    dump_policy(POLICY_ON, policy_file)
    results = []
    for mode in args.modes.split(","):
        flags, env = MODES[mode]
        server = Process(["--model", args.model, "--policy", str(policy_file), "--max-batch", str(args.max_batch),
                          "--max-queue", "64", *flags], work / f"{mode}.log", env)
        try:
            for n in levels:
                time.sleep(args.export_wait)
                before = scrape(server.url)
                samples, wall = run_clients(server, n, args.duration)  # type: ignore[arg-type]
                time.sleep(args.export_wait)
                r = with_metrics(summarize(mode, n, samples, wall, (0.0, 0.0)), before, scrape(server.url))
                results.append(r)
                print(f"{mode:7} N={n:<3} {r.tokens_per_s:7.1f} tok/s  p50 {fmt(r.latency_p50_s, 2)} s  "
                      f"p95 {fmt(r.latency_p95_s, 2)} s  ttft p50 {fmt(r.ttft_p50_s, 3)} s  "
                      f"device-s/req {fmt(r.device_s_per_request)}  errors {r.errors}  429 {r.rejected_429}",
                      flush=True)
        finally:
            print(f"{mode}: server exited with {server.stop()}", flush=True)
    table = ["| mode | clients | tokens/s | p50 latency s | p95 latency s | TTFT p50 s | device-s/request | errors |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        table.append(f"| {r.policy} | {r.concurrency} | {r.tokens_per_s:.1f} | {fmt(r.latency_p50_s, 2)} | "
                     f"{fmt(r.latency_p95_s, 2)} | {fmt(r.ttft_p50_s, 3)} | {fmt(r.device_s_per_request)} | "
                     f"{r.errors + r.rejected_429} |")
    print("\n".join(table))
    if args.out:
        (work / "table.md").write_text("\n".join(table) + "\n")
        (work / "results.json").write_text(json.dumps([asdict(r) for r in results], indent=1))
    print(json.dumps({"model": args.model, "levels": [{"mode": r.policy, "concurrency": r.concurrency,
                                                        "tokens_per_s": round(r.tokens_per_s, 2)} for r in results]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
