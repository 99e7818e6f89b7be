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
out = []
for c in classes:
    learned = {a: (Calibrator(), SuccessorTable()) for a in ARMS}
    for i, r in enumerate(parse_workload(f"{wl}/{c}.jsonl")[:n]):
        samp = SamplingConfig(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, seed=r.effective_seed)
        res = {}
        for arm in ARMS[i % len(ARMS):] + ARMS[:i % len(ARMS)]:
            ARM["v"] = arm
            cal, suc = learned[arm]
            g = generate(M, r.chat() if r.prompt is None else r.prompt, raw=r.prompt is not None, max_new_tokens=128,
                         strategy=strategy, sampling=samp, calibrator=cal, successors=suc)
            s = g.stats
            res[arm] = dict(ids=g.token_ids, dec=s.decode_s, steps=s.steps, q=s.processed_tokens, n=len(g.token_ids),
                            spec=s.speculative_steps)
        base = res[ARMS[0]]
        row = dict(cls=c, id=r.id, n=base["n"], same=all(res[a]["ids"] == base["ids"] for a in ARMS),
                   speed=base["dec"] / res["shadows"]["dec"],
                   **{f"tps {a}": res[a]["n"] / res[a]["steps"] for a in ARMS},
                   **{f"q {a}": res[a]["q"] / res[a]["steps"] for a in ARMS},
                   **{f"spec {a}": res[a]["spec"] / res[a]["steps"] for a in ARMS})
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
