"""Continuous batching under load, in one process: where does speculation stop paying as load grows?

N closed-loop clients (each sends its next request when the previous one finishes) draw from one fixed
list of requests (public workloads, classes round-robin). The same requests run through the engine's
scheduler in three modes, interleaved level by level and repeated:

    serial      lookahead, max batch 1: one request at a time (the server before batching)
    batched-ar  autoregressive, max batch B: plain continuous batching
    batched     lookahead, max batch B: continuous batching, the allocator sizing every pass

Every mode decodes the same requests to the same tokens (checked: speed on divergent text says
nothing). Reported per mode and N: throughput (completion tokens / wall s), p50/p95 latency and time
to first token (from the client's send), device-seconds per request (pass time, a batched pass split
evenly among its requests), mean batch, rows and speculative rows per pass. A table, then one JSON line.

    lookahead workloads build --out /tmp/wl
    python benchmarks/batch_load.py --workload /tmp/wl --concurrency 1,2,4,8,16 --requests 32
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import lookahead  # noqa: E402
from lookahead.config import GenerationConfig, SamplingConfig  # noqa: E402
from lookahead.scheduler.request import Request  # noqa: E402
from lookahead.scheduler.scheduler import Scheduler, SchedulerConfig  # noqa: E402
from lookahead.workloads.format import load_workloads  # noqa: E402

MODES = {"serial": ("lookahead", 1), "batched-ar": ("autoregressive", None), "batched": ("lookahead", None)}


@dataclass
class Level:
    mode: str
    concurrency: int
    repeat: int
    wall_s: float
    tokens: int
    tokens_per_s: float
    latency_p50_s: float
    latency_p95_s: float
    ttft_p50_s: float
    ttft_p95_s: float
    device_s_per_request: float
    mean_batch: float
    rows_per_pass: float
    speculative_rows_per_pass: float
    device_s_by_class: dict[str, float]  # mean device-seconds per request of each class (a pass split evenly)


def pct(values: list[float], q: int) -> float:
    return values[0] if len(values) == 1 else statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def run_level(lm: lookahead.LoadedModel, requests: list[tuple[str, list[int], GenerationConfig]], mode: str,
              concurrency: int, max_batch: int, repeat: int) -> tuple[Level, list[list[int]]]:
    strategy, batch = MODES[mode]
    scheduler = Scheduler(lm, SchedulerConfig(max_batch=batch or max_batch))
    queue = list(range(len(requests)))  # request indices in send order
    waiting: list[tuple[int, float]] = []  # (index, sent at): sent by a client, not yet admitted
    sent: dict[int, float] = {}
    first: dict[int, float] = {}
    done: dict[int, float] = {}
    out: dict[int, list[int]] = {}
    index: dict[int, int] = {}
    passes = rows = speculative = requests_in_passes = 0
    device: dict[int, float] = {}
    t0 = time.perf_counter()
    for _ in range(min(concurrency, len(queue))):  # every client sends its first request
        i = queue.pop(0)
        waiting.append((i, time.perf_counter()))
    while waiting or scheduler.active:
        while waiting and scheduler.free_slots:  # 1. admit (prefill) what the batch has room for
            i, at = waiting.pop(0)
            _, ids, cfg = requests[i]
            request = Request(lm, ids, GenerationConfig(max_new_tokens=cfg.max_new_tokens, strategy=strategy,
                                                       sampling=cfg.sampling))
            index[id(request)] = i
            sent[i] = at
            scheduler.add(request)
        events = scheduler.step()  # 2. one pass for the batch
        now = time.perf_counter()
        last = scheduler.last
        if last is not None:
            passes += 1
            rows += last.rows
            speculative += last.speculative_rows
            requests_in_passes += last.batch
        for request, event in events:  # 3. deliver; a client whose request finished sends its next
            i = index[id(request)]
            if event.token_ids and i not in first:
                first[i] = now
            if event.result is not None:
                done[i] = now
                out[i] = event.result.token_ids
                device[i] = event.result.stats.device_s
                if queue:
                    waiting.append((queue.pop(0), now))
    wall = time.perf_counter() - t0
    latency = [done[i] - sent[i] for i in done]
    ttft = [first[i] - sent[i] for i in first]
    tokens = sum(len(t) for t in out.values())
    by_class: dict[str, list[float]] = {}
    for i, seconds in device.items():
        by_class.setdefault(requests[i][0], []).append(seconds)
    level = Level(mode, concurrency, repeat, round(wall, 3), tokens, round(tokens / wall, 2),
                  round(pct(latency, 50), 3), round(pct(latency, 95), 3), round(pct(ttft, 50), 3),
                  round(pct(ttft, 95), 3), round(sum(device.values()) / len(done), 4),
                  round(requests_in_passes / passes, 2), round(rows / passes, 2), round(speculative / passes, 2),
                  {c: round(statistics.fmean(v), 4) for c, v in sorted(by_class.items())})
    return level, [out[i] for i in range(len(requests))]


def print_by_class(results: list[Level], levels: list[int], modes: list[str]) -> None:
    """Device-seconds per request by class: one row per class, one column per mode and concurrency
    (medians over repeats)."""
    columns = [(mode, n) for n in levels for mode in modes]
    classes = sorted({c for r in results for c in r.device_s_by_class})
    print("\n| class | " + " | ".join(f"{mode} N={n}" for mode, n in columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for c in classes:
        cells = []
        for mode, n in columns:
            values = [r.device_s_by_class[c] for r in results
                      if r.mode == mode and r.concurrency == n and c in r.device_s_by_class]
            cells.append(f"{statistics.median(values):.3f}" if values else "-")
        print(f"| {c} | " + " | ".join(cells) + " |")


def plot(levels: list[dict], path: Path) -> None:
    """Throughput and device-seconds per request against concurrency, one line per mode (medians over
    repeats): the crossover where speculation stops paying as load grows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for mode in dict.fromkeys(r["mode"] for r in levels):
        ns = sorted({r["concurrency"] for r in levels if r["mode"] == mode})
        med = {f: [statistics.median(r[f] for r in levels if r["mode"] == mode and r["concurrency"] == n) for n in ns]
               for f in ("tokens_per_s", "device_s_per_request")}
        left.plot(ns, med["tokens_per_s"], marker="o", label=mode)
        right.plot(ns, med["device_s_per_request"], marker="o", label=mode)
    for ax, title in ((left, "throughput (completion tokens / s)"), (right, "device-seconds per request")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--workload", required=True, help="workload folder or files (lookahead workloads build)")
    p.add_argument("--concurrency", default="1,2,4,8,16")
    p.add_argument("--requests", type=int, default=32, help="requests per level (default 32)")
    p.add_argument("--max-new-tokens", type=int, default=96, help="cap on each request's tokens (default 96)")
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", help="write every level as JSON here, and the crossover plot beside it (.png)")
    args = p.parse_args(argv)
    levels = [int(n) for n in args.concurrency.split(",")]
    modes = [m for m in args.modes.split(",") if m]
    if set(modes) - set(MODES) or min(levels) < 1 or args.requests < 1:
        print(f"error: modes are {', '.join(MODES)}; concurrency and requests >= 1", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    lm = lookahead.load(args.model, dtype=args.dtype)
    folder = Path(args.workload)
    files = sorted(folder.glob("*.jsonl")) if folder.is_dir() else [folder]
    pool = load_workloads(files)
    by_class: dict[str, list] = {}
    for r in pool:
        by_class.setdefault(r.cls, []).append(r)
    mixed = [r for group in itertools.zip_longest(*by_class.values()) for r in group if r is not None]
    requests = []
    for r in mixed[: args.requests]:
        ids = lm.encode(r.chat() if r.messages is not None else r.prompt)
        sampling = SamplingConfig() if r.greedy else SamplingConfig(temperature=r.temperature, top_p=r.top_p,
                                                                    top_k=r.top_k, seed=r.effective_seed)
        requests.append((r.cls, ids, GenerationConfig(max_new_tokens=min(r.max_tokens or args.max_new_tokens,
                                                                  args.max_new_tokens), sampling=sampling)))
    run_level(lm, requests[:2], "batched", 2, args.max_batch, -1)  # warm-up
    results: list[Level] = []
    reference: list[list[int]] | None = None
    mismatches = 0
    for n in levels:
        for rep in range(args.repeats):
            for mode in (modes if rep % 2 == 0 else modes[::-1]):  # interleaved, order alternating
                level, tokens = run_level(lm, requests, mode, n, args.max_batch, rep)
                if reference is None:
                    reference = tokens
                mismatches += sum(a != b for a, b in zip(tokens, reference))
                results.append(level)
                print(f"{mode:10s} N={n:<3d} rep {rep}: {level.tokens_per_s:7.1f} tok/s p50 {level.latency_p50_s:.2f}s "
                      f"batch {level.mean_batch} rows/pass {level.rows_per_pass}", file=sys.stderr, flush=True)
    print("| mode | N | tokens/s | p50 latency s | p95 latency s | p50 TTFT s | p95 TTFT s | device-s/request "
          "| batch | rows/pass | spec rows/pass |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    summary: dict[str, float] = {}
    for n in levels:
        for mode in modes:
            mine = [r for r in results if r.mode == mode and r.concurrency == n]
            med = {f: statistics.median(getattr(r, f) for r in mine) for f in (
                "tokens_per_s", "latency_p50_s", "latency_p95_s", "ttft_p50_s", "ttft_p95_s", "device_s_per_request",
                "mean_batch", "rows_per_pass", "speculative_rows_per_pass")}
            summary[f"{mode}@{n}"] = round(med["tokens_per_s"], 2)
            print(f"| {mode} | {n} | {med['tokens_per_s']:.1f} | {med['latency_p50_s']:.2f} | {med['latency_p95_s']:.2f} | "
                  f"{med['ttft_p50_s']:.2f} | {med['ttft_p95_s']:.2f} | {med['device_s_per_request']:.3f} | "
                  f"{med['mean_batch']:.2f} | {med['rows_per_pass']:.2f} | {med['speculative_rows_per_pass']:.2f} |")
    print_by_class(results, levels, modes)
    if args.out:
        out = Path(args.out)
        out.write_text(json.dumps({"model": args.model, "dtype": str(lm.dtype), "requests": args.requests,
                                   "max_new_tokens": args.max_new_tokens, "mismatches": mismatches,
                                   "levels": [asdict(r) for r in results]}, indent=1) + "\n")
        plot([asdict(r) for r in results], out.with_suffix(".png"))
    print(json.dumps({"model": args.model, "dtype": str(lm.dtype).replace("torch.", ""), "mismatches": mismatches,
                      "tokens_per_s": summary}))
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
