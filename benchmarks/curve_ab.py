"""A/B of two cost curves: how much the allocator's view of the device changes speed.

The allocator (engine/allocator.py) sizes every step from the model's cost curve, refined online from the
engine's own timings. This runs the default lookahead strategy twice per request, once with each curve
installed as the model's curve (each arm keeps refining its own across requests, and has its own
calibrator and recycled successors per class, as the bench keeps them), arms interleaved in alternating
order, outputs required identical. Curves come from a cost-curves.json (~/.cache/lookahead/), by the
start of their key or by their version suffix (e.g. "v2", "v3").

    lookahead workloads build --out /tmp/wl
    python benchmarks/curve_ab.py --workload /tmp/wl --curves ~/.cache/lookahead/cost-curves.json \
        --a v2 --b v3 [--per-class 8] [--from 20]

Prints per request and per class the paired speed b over a (median of a's decode time per token over
b's), tokens per step and query rows per step of each arm, then one JSON line.
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
from lookahead.engine import costs
from lookahead.engine.calibration import Calibrator

CLASSES = ("chat", "code", "function_calling", "math", "summarization")  # greedy classes


def pick(stored: dict[str, dict[str, float]], name: str) -> dict[str, float]:
    hits = [v for k, v in stored.items() if k.endswith(f"|{name}") or k.startswith(name)]
    if len(hits) != 1:
        sys.exit(f"{name!r} names {len(hits)} curves in the file; give a version suffix or a unique key prefix")
    return hits[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", type=Path, required=True, help="a folder `lookahead workloads build` wrote")
    ap.add_argument("--curves", type=Path, required=True, help="a cost-curves.json")
    ap.add_argument("--a", required=True, help="the first curve (version suffix or key prefix)")
    ap.add_argument("--b", required=True, help="the second curve")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--per-class", type=int, default=8)
    ap.add_argument("--from", dest="start", type=int, default=20, help="first request of each class (held out)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    stored = json.loads(args.curves.read_text())
    lm = lookahead.load(args.model)
    lookahead.generate(lm, "hello", max_new_tokens=8)  # the model's curve slot exists from here on
    slots = costs._CURVES[lm.model]
    kind = next(iter(slots))
    arms = {name: costs.CostCurve.from_json(pick(stored, name), kind[0]) for name in (args.a, args.b)}
    rows = []
    for cls in CLASSES:
        reqs = [json.loads(line) for line in (args.workload / f"{cls}.jsonl").open()][args.start : args.start + args.per_class]
        learned = {name: (Calibrator(), SuccessorTable()) for name in arms}
        for i, req in enumerate(reqs):
            got = {}
            for name in list(arms)[:: 1 if i % 2 == 0 else -1]:
                slots[kind] = arms[name]
                calibrator, successors = learned[name]
                res = lookahead.generate(lm, req["messages"], max_new_tokens=args.max_new_tokens,
                                         calibrator=calibrator, successors=successors)
                s = res.stats
                got[name] = (tuple(res.token_ids), s.decode_s / max(s.new_tokens, 1), s.tokens_per_step,
                             s.processed_tokens / max(s.steps, 1))
            a, b = got[args.a], got[args.b]
            if a[0] != b[0]:
                sys.exit(f"{req['id']}: the arms produced different tokens; that is a bug")
            rows.append({"class": cls, "id": req["id"], "speed": a[1] / b[1], "tps": (a[2], b[2]), "rows": (a[3], b[3])})
            print(f"{cls:16s} {req['id']:32s} b/a speed {rows[-1]['speed']:.3f}  tok/step {a[2]:.2f} {b[2]:.2f}  "
                  f"rows {a[3]:.1f} {b[3]:.1f}", flush=True)
    summary = {}
    for cls in CLASSES:
        rs = [r for r in rows if r["class"] == cls]
        summary[cls] = {"speed": round(statistics.median(r["speed"] for r in rs), 3),
                        "tokens_per_step": [round(statistics.fmean(r["tps"][j] for r in rs), 3) for j in (0, 1)],
                        "rows_per_step": [round(statistics.fmean(r["rows"][j] for r in rs), 2) for j in (0, 1)]}
        print(f"{cls:16s} paired speed b over a {summary[cls]['speed']:.3f}  tok/step {summary[cls]['tokens_per_step']}  "
              f"rows {summary[cls]['rows_per_step']}")
    print(json.dumps({"a": args.a, "b": args.b, "speed": round(statistics.median(r["speed"] for r in rows), 3),
                      "classes": summary, "curves_after": {n: [round(c(w), 3) for w in (2, 3, 4, 6, 8, 12, 16)]
                                                            for n, c in arms.items()}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
