"""Closed-loop A/B/C of the allocator's inputs on the public workloads (greedy and sampled classes).

Arms (names as given on the command line; the default is all three):
  clip       the realization factor capped at 1, each step's own E/c (the shipped rule)
  free       the realization factor uncapped (probabilities still capped at 1)
  free+rate  uncapped, and E - rate * c with the request's long-run rate (Dinkelbach)
  clip+rate  capped, with the long-run rate
The "free" and "+rate" arms need rate-and-uncapped-realization.patch applied (to d4fd5df; it adds
Request.rate and uncaps Request.realization; this script re-caps it for the "clip" arms).

Every request runs in every arm, arms interleaved per request in rotating order; each arm has its own
calibrator and recycled successors per class (as a server keeps them per class). Outputs are checked
identical across arms. Usage: WL=<lookahead workloads build folder> python ab.py CLASSES N SKIP STRATEGY [ARMS]
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
real_real = rq.Request.realization
real_rate = getattr(rq.Request, "rate", None)
ARM = {"v": "clip"}
rq.Request.realization = property(lambda self: min(1.0, real_real.fget(self)) if ARM["v"].startswith("clip")
                                  else real_real.fget(self))
if real_rate is not None:
    rq.Request.rate = property(lambda self: real_rate.fget(self) if ARM["v"].endswith("+rate") else None)
ARMS = sys.argv[5].split(",") if len(sys.argv) > 5 else ["clip", "free", "free+rate"]
if real_rate is None and any(a != "clip" for a in ARMS):
    sys.exit("the free and +rate arms need rate-and-uncapped-realization.patch applied")
classes, n, start, strategy = sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
wl = os.environ.get("WL", "workloads")
out = []
for c in classes:
    learned = {a: (Calibrator(), SuccessorTable()) for a in ARMS}
    for i, r in enumerate(parse_workload(f"{wl}/{c}.jsonl")[start:start + n]):
        samp = SamplingConfig(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, seed=r.effective_seed)
        res = {}
        for arm in ARMS[i % len(ARMS):] + ARMS[:i % len(ARMS)]:
            ARM["v"] = arm
            cal, suc = learned[arm]
            g = generate(M, r.chat() if r.prompt is None else r.prompt, raw=r.prompt is not None, max_new_tokens=128,
                         strategy=strategy, sampling=samp, calibrator=cal, successors=suc)
            s = g.stats
            res[arm] = dict(ids=g.token_ids, dec=s.decode_s, steps=s.steps, q=s.processed_tokens, n=len(g.token_ids))
        base = res[ARMS[0]]
        row = dict(cls=c, id=r.id, n=base["n"], same=all(res[a]["ids"] == base["ids"] for a in ARMS),
                   **{f"{a}/{ARMS[0]}": base["dec"] / res[a]["dec"] for a in ARMS[1:]},
                   **{f"tps {a}": res[a]["n"] / res[a]["steps"] for a in ARMS},
                   **{f"q {a}": res[a]["q"] / res[a]["steps"] for a in ARMS})
        out.append(row)
        print(json.dumps(row), flush=True)


def gm(xs):
    return math.exp(statistics.fmean(math.log(x) for x in xs))


for c in classes + ["all"]:
    rows = [x for x in out if c == "all" or x["cls"] == c]
    print(f"{c:18s} same {sum(x['same'] for x in rows)}/{len(rows)} " + " ".join(
        f"{a}: speed {gm([x[f'{a}/{ARMS[0]}'] for x in rows]):.3f} "
        f"(median {statistics.median(x[f'{a}/{ARMS[0]}'] for x in rows):.3f})" for a in ARMS[1:])
        + " | tok/step " + "/".join(f"{statistics.fmean(x[f'tps {a}'] for x in rows):.2f}" for a in ARMS)
        + " q/step " + "/".join(f"{statistics.fmean(x[f'q {a}'] for x in rows):.2f}" for a in ARMS))
