"""A/B of exact trees: lookahead whose exact steps verify whole trees at aligned key offsets, against
the same strategy verifying each tree's first chain only.

At reduced precision an exact step could verify only the tree's likeliest chain: a node of another
branch sees masked keys between its visible ones, which moves them to other lanes and pairs of the
kernels' reductions. With aligned offsets (engine/query.py align_tree) each node's key sits where those
reductions treat it as in autoregressive decoding, so whole trees are verified at the cost of masked
keys. This runs both on held-out workload requests, arms interleaved in alternating order, each with
its own calibrator and recycled successors per class (as the bench keeps them); outputs must be
identical.

    lookahead workloads build --out /tmp/wl
    python benchmarks/trees_ab.py --workload /tmp/wl [--per-class 8] [--from 20]

Prints per request and per class the paired speed of trees over first chains (median of the chain
arm's decode time per token over the tree arm's), tokens per step and query rows per step of each arm,
then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

import lookahead
from lookahead.candidates.recycling import SuccessorTable
from lookahead.engine.calibration import Calibrator
from lookahead.engine.numerics import width_probe

CLASSES = ("chat", "code", "function_calling", "math", "summarization")  # greedy classes
ARMS = {"chain": False, "trees": True}  # arm -> aligned_trees


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", type=Path, required=True, help="a folder `lookahead workloads build` wrote")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--per-class", type=int, default=8)
    ap.add_argument("--from", dest="start", type=int, default=20, help="first request of each class (held out)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lm = lookahead.load(args.model)
    lookahead.generate(lm, "hello", max_new_tokens=8)  # probe and cost curve before any timing
    if not width_probe(lm.model).aligned_exact:
        sys.exit("the width probe did not find aligned trees exact on this model and device: nothing to compare")
    rows = []
    for cls in CLASSES:
        reqs = [json.loads(line) for line in (args.workload / f"{cls}.jsonl").open()][args.start : args.start + args.per_class]
        learned = {name: (Calibrator(), SuccessorTable()) for name in ARMS}
        for i, req in enumerate(reqs):
            got = {}
            for name in list(ARMS)[:: 1 if i % 2 == 0 else -1]:
                calibrator, successors = learned[name]
                res = lookahead.generate(lm, req["messages"], max_new_tokens=args.max_new_tokens,
                                         calibrator=calibrator, successors=successors, aligned_trees=ARMS[name])
                s = res.stats
                got[name] = (tuple(res.token_ids), s.decode_s / max(s.new_tokens, 1), s.tokens_per_step,
                             s.processed_tokens / max(s.steps, 1))
            a, b = got["chain"], got["trees"]
            if a[0] != b[0]:
                sys.exit(f"{req['id']}: the arms produced different tokens; that is a bug")
            rows.append({"class": cls, "id": req["id"], "speed": a[1] / b[1], "tps": (a[2], b[2]), "rows": (a[3], b[3])})
            print(f"{cls:16s} {req['id']:32s} trees/chain speed {rows[-1]['speed']:.3f}  tok/step {a[2]:.2f} {b[2]:.2f}  "
                  f"rows {a[3]:.1f} {b[3]:.1f}", flush=True)
    summary = {}
    for cls in CLASSES:
        rs = [r for r in rows if r["class"] == cls]
        summary[cls] = {"speed": round(statistics.median(r["speed"] for r in rs), 3),
                        "tokens_per_step": [round(statistics.fmean(r["tps"][j] for r in rs), 3) for j in (0, 1)],
                        "rows_per_step": [round(statistics.fmean(r["rows"][j] for r in rs), 2) for j in (0, 1)]}
        print(f"{cls:16s} paired speed trees over chain {summary[cls]['speed']:.3f}  "
              f"tok/step {summary[cls]['tokens_per_step']}  rows {summary[cls]['rows_per_step']}")
    print(json.dumps({"speed": round(statistics.median(r["speed"] for r in rows), 3), "classes": summary}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
