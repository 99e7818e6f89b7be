"""Closed-loop A/B of the realization's shadows (engine/realization.py) on the public workloads.

Arms: "shadows" (the shipped rule: steps the realization priced out of speculating are scored on the
tokens that follow) and "verified-only" (Request.shadow a no-op: the ratio learns from verified steps
only, the rule before 7c8684b). Every request runs in both arms, interleaved per request in rotating
order; each arm keeps its own calibrator and recycled successors per class (as a server keeps them per
class). Outputs are checked identical across arms.

    WL=<lookahead workloads build folder> python ab.py CLASSES N [STRATEGY]
"""
import json
import math
import os
import statistics
import sys

import torch

import lookahead
import lookahead.scheduler.request as rq
from lookahead.candidates.recycling import SuccessorTable
from lookahead.config import SamplingConfig
from lookahead.engine.calibration import Calibrator
from lookahead.generation import generate
from lookahead.workloads.format import parse_workload

torch.set_num_threads(2)
M = lookahead.load("smollm2-135m-instruct", dtype="bfloat16")
real_shadow = rq.Request.shadow
ARMS = ["verified-only", "shadows"]
ARM = {"v": ARMS[0]}
rq.Request.shadow = lambda self, nodes: real_shadow(self, nodes) if ARM["v"] == "shadows" else None
classes, n = sys.argv[1].split(","), int(sys.argv[2])
strategy = sys.argv[3] if len(sys.argv) > 3 else "lookahead"
wl = os.environ.get("WL", "workloads")
generate(M, "warm up", max_new_tokens=8, strategy=strategy)


def decode(request, arm: str, learned: tuple[Calibrator, SuccessorTable]) -> dict:
    """One workload request in one arm, with that arm's learned state for the class."""
    ARM["v"] = arm
    sampling = SamplingConfig(temperature=request.temperature, top_p=request.top_p, top_k=request.top_k,
                              seed=request.effective_seed)
    prompt = request.chat() if request.prompt is None else request.prompt
    g = generate(M, prompt, raw=request.prompt is not None, max_new_tokens=128, strategy=strategy, sampling=sampling,
                 calibrator=learned[0], successors=learned[1])
    s = g.stats
    return {"ids": g.token_ids, "dec": s.decode_s, "tps": len(g.token_ids) / s.steps, "q": s.processed_tokens / s.steps,
            "spec": s.speculative_steps / s.steps}


out = []
for c in classes:
    learned = {a: (Calibrator(), SuccessorTable()) for a in ARMS}
    for i, r in enumerate(parse_workload(f"{wl}/{c}.jsonl")[:n]):
        rotated = ARMS[i % len(ARMS):] + ARMS[:i % len(ARMS)]  # who goes first alternates
        res = {arm: decode(r, arm, learned[arm]) for arm in rotated}
        row = {"cls": c, "id": r.id, "n": len(res[ARMS[0]]["ids"]),
               "same": all(res[a]["ids"] == res[ARMS[0]]["ids"] for a in ARMS),
               "speed": res["verified-only"]["dec"] / res["shadows"]["dec"]}
        for key in ("tps", "q", "spec"):
            row.update({f"{key} {a}": res[a][key] for a in ARMS})
        out.append(row)
        print(json.dumps(row), flush=True)


def gm(xs):
    return math.exp(statistics.fmean(math.log(x) for x in xs))


print(f"\n{'class':18s}{'same':>7}{'shadows/verified-only':>23}{'median':>8}{'min':>7}   tok/step   q/step  speculative steps")
for c in classes + ["all"]:
    rows = [x for x in out if c == "all" or x["cls"] == c]
    print(f"{c:18s}{sum(x['same'] for x in rows):>3}/{len(rows):<3}{gm([x['speed'] for x in rows]):>23.3f}"
          f"{statistics.median(x['speed'] for x in rows):>8.3f}{min(x['speed'] for x in rows):>7.3f}   "
          + "/".join(f"{statistics.fmean(x[f'tps {a}'] for x in rows):.2f}" for a in ARMS) + "  "
          + "/".join(f"{statistics.fmean(x[f'q {a}'] for x in rows):.2f}" for a in ARMS) + "  "
          + "/".join(f"{statistics.fmean(x[f'spec {a}'] for x in rows):.2f}" for a in ARMS))
print(json.dumps({c: gm([x["speed"] for x in out if c == "all" or x["cls"] == c]) for c in classes + ["all"]}))
