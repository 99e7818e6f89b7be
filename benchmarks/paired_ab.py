"""Paired A/B of two lookahead arms on held-out workload requests (used by curve_ab.py and trees_ab.py).

Each request of each greedy class runs once per arm, arms interleaved in alternating order (A B, B A,
...), each arm with its own calibrator and recycled successors per class, as the bench keeps them;
outputs must be identical (speed on different text says nothing). Prints per request and per class the
paired speed of b over a (median over requests of a's decode time per token over b's), tokens per step
and query rows per step of each arm; returns the summary for the caller's JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lookahead.candidates.recycling import SuccessorTable
from lookahead.engine.calibration import Calibrator

CLASSES = ("chat", "code", "function_calling", "math", "summarization")  # greedy classes

# an arm: (messages, calibrator, successors, max_new_tokens) -> GenerationResult
Arm = Callable[[list[dict[str, str]], Calibrator, SuccessorTable, int], Any]


def paired_parser(doc: str) -> argparse.ArgumentParser:
    """The arguments every paired A/B script takes; the script adds its own."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--workload", type=Path, required=True, help="a folder `lookahead workloads build` wrote")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--per-class", type=int, default=8)
    ap.add_argument("--from", dest="start", type=int, default=20, help="first request of each class (held out)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--classes", default=",".join(CLASSES), help="comma-separated classes (default: every greedy one)")
    return ap


def run_paired(workload: Path, arms: dict[str, Arm], a: str, b: str, per_class: int, start: int,
               max_new_tokens: int, calibrators: dict[str, Callable[[], Calibrator]] | None = None,
               classes: Sequence[str] = CLASSES) -> dict[str, Any]:
    """`calibrators`: how an arm makes its calibrator for a class (default: Calibrator())."""
    rows = []
    make = calibrators or {}
    for cls in classes:
        with (workload / f"{cls}.jsonl").open() as f:
            reqs = [json.loads(line) for line in f][start : start + per_class]
        learned = {name: (make.get(name, Calibrator)(), SuccessorTable()) for name in arms}
        for i, req in enumerate(reqs):
            got = {}
            for name in list(arms)[:: 1 if i % 2 == 0 else -1]:
                res = arms[name](req["messages"], *learned[name], max_new_tokens)
                s = res.stats
                got[name] = (tuple(res.token_ids), s.decode_s / max(s.new_tokens, 1), s.tokens_per_step,
                             s.processed_tokens / max(s.steps, 1))
            ra, rb = got[a], got[b]
            if ra[0] != rb[0]:
                sys.exit(f"{req['id']}: the arms produced different tokens; that is a bug")
            rows.append({"class": cls, "id": req["id"], "speed": ra[1] / rb[1], "tps": (ra[2], rb[2]),
                         "rows": (ra[3], rb[3])})
            print(f"{cls:16s} {req['id']:32s} {b}/{a} speed {rows[-1]['speed']:.3f}  tok/step {ra[2]:.2f} {rb[2]:.2f}  "
                  f"rows {ra[3]:.1f} {rb[3]:.1f}", flush=True)
    summary = {}
    for cls in classes:
        rs = [r for r in rows if r["class"] == cls]
        summary[cls] = {"speed": round(statistics.median(r["speed"] for r in rs), 3),
                        "tokens_per_step": [round(statistics.fmean(r["tps"][j] for r in rs), 3) for j in (0, 1)],
                        "rows_per_step": [round(statistics.fmean(r["rows"][j] for r in rs), 2) for j in (0, 1)]}
        print(f"{cls:16s} paired speed {b} over {a} {summary[cls]['speed']:.3f}  "
              f"tok/step {summary[cls]['tokens_per_step']}  rows {summary[cls]['rows_per_step']}")
    return {"a": a, "b": b, "speed": round(statistics.median(r["speed"] for r in rows), 3), "classes": summary}
