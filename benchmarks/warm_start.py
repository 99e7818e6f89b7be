"""Warm start: what a new process gains from a learned-state file (lookahead/learned.py).

A command-line one-shot or a restarted server starts with no acceptance estimates and no recycled
successors. This benchmark teaches one process's shared state on --train requests of each workload
class (in turn, as mixed traffic), saves it with `lookahead.save_learned`, then decodes --test other
requests of each class twice, interleaved: cold (`reset_shared()`: a new process) and warm (a new
process that ran `lookahead.load_learned(file)` first, as `lookahead generate --learned FILE` does).
Every request starts from the file, never from another test request. Outputs must be identical.

    lookahead workloads build --out /tmp/wl
    python benchmarks/warm_start.py --workload /tmp/wl [--train 8] [--test 8] [--max-new-tokens 128]

Prints per class tokens per step cold/warm and the paired speed (median of cold/warm decode time per
token), then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

import lookahead
from lookahead.engine.shared import reset_shared

CLASSES = ("chat", "code", "function_calling", "math", "summarization")  # greedy classes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", type=Path, required=True, help="a folder `lookahead workloads build` wrote")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--train", type=int, default=8, help="requests per class that teach the saved state")
    ap.add_argument("--test", type=int, default=8, help="requests per class decoded cold and warm")
    ap.add_argument("--test-from", type=int, default=20, help="index of the first test request in each class")
    ap.add_argument("--train-from", type=int, default=64, help="index of the first teaching request in each class")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lm = lookahead.load(args.model)
    work = {c: [json.loads(line)["messages"] for line in (args.workload / f"{c}.jsonl").open()] for c in CLASSES}

    # 1. Teach one process's shared state on mixed traffic and save it.
    reset_shared()
    for i in range(args.train_from, args.train_from + args.train):
        for c in CLASSES:
            lookahead.generate(lm, work[c][i], max_new_tokens=args.max_new_tokens)
    path = Path(tempfile.mkdtemp()) / "learned.json"
    lookahead.save_learned(lm, path)

    # 2. Each test request twice, alternating which arm goes first: a cold process and a warm one.
    rows: dict[str, list[dict[str, float]]] = {c: [] for c in CLASSES}
    for n, i in enumerate(range(args.test_from, args.test_from + args.test)):
        for c in CLASSES:
            runs = {}
            for arm in (("cold", "warm") if n % 2 else ("warm", "cold")):
                reset_shared()
                if arm == "warm":
                    lookahead.load_learned(lm, path)
                runs[arm] = lookahead.generate(lm, work[c][i], max_new_tokens=args.max_new_tokens)
            if runs["cold"].token_ids != runs["warm"].token_ids:
                print(f"MISMATCH {c} #{i}", file=sys.stderr)
                return 1
            s = {arm: r.stats for arm, r in runs.items()}
            rows[c].append({"cold_tps": s["cold"].tokens_per_step, "warm_tps": s["warm"].tokens_per_step,
                            "speed": (s["cold"].decode_s / s["cold"].new_tokens) / (s["warm"].decode_s / s["warm"].new_tokens)})

    print(f"{'class':<18}{'tok/step cold':>14}{'warm':>7}{'change':>9}{'paired speed warm/cold':>25}")
    summary = {}
    for c, r in rows.items():
        cold = statistics.mean(x["cold_tps"] for x in r)
        warm = statistics.mean(x["warm_tps"] for x in r)
        speed = statistics.median(x["speed"] for x in r)
        summary[c] = {"cold_tokens_per_step": round(cold, 3), "warm_tokens_per_step": round(warm, 3),
                      "paired_speed": round(speed, 3), "requests": len(r)}
        print(f"{c:<18}{cold:>14.2f}{warm:>7.2f}{warm / cold - 1:>+9.1%}{speed:>24.3f}x")
    print(json.dumps({"benchmark": "warm_start", "model": args.model, "train_per_class": args.train,
                      "file_bytes": path.stat().st_size, "classes": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
