"""Closed-loop A/B of the model's confidence in guessed tokens (candidates/confidence.py) on the
public workloads.

Arms: "confidence" (the shipped rule: each guessed token's calibrated rate scaled by a factor learned for
the model's confidence in it) and "rates-only" (CalibrationConfig(confidence=False): the rates of
(source, feature, depth) alone, the rule before). Every request runs in both arms, interleaved per
request in rotating order; each arm keeps its own calibrator and recycled successors per class (as a
server keeps them per class). Outputs are checked identical across arms. Prompts prefill whole (no
prefix cache: the second arm would find the first arm's prompt stored).

    WL=<lookahead workloads build folder> python ab.py CLASSES N [FIRST]
"""
import json
import math
import os
import statistics
import sys

import torch

import lookahead
from lookahead.candidates.recycling import SuccessorTable
from lookahead.config import SamplingConfig
from lookahead.engine.calibration import CalibrationConfig, Calibrator
from lookahead.generation import generate
from lookahead.workloads.format import parse_workload

torch.set_num_threads(2)
M = lookahead.load("smollm2-135m-instruct", dtype="bfloat16")
ARMS = ["rates-only", "confidence"]
classes, n = sys.argv[1].split(","), int(sys.argv[2])
first = int(sys.argv[3]) if len(sys.argv) > 3 else 0  # the first request of each class
strategy = "lookahead"
wl = os.environ.get("WL", "workloads")
generate(M, "warm up", max_new_tokens=8, strategy=strategy)


def decode(request, arm: str, learned: tuple[Calibrator, SuccessorTable]) -> dict:
    """One workload request in one arm, with that arm's learned state for the class."""
    sampling = SamplingConfig(temperature=request.temperature, top_p=request.top_p, top_k=request.top_k,
                              seed=request.effective_seed)
    prompt = request.chat() if request.prompt is None else request.prompt
    g = generate(M, prompt, raw=request.prompt is not None, max_new_tokens=128, strategy=strategy, sampling=sampling,
                 calibrator=learned[0], successors=learned[1], prefix_cache=False)
    s = g.stats
    return {"ids": g.token_ids, "dec": s.decode_s, "tps": len(g.token_ids) / s.steps, "q": s.processed_tokens / s.steps,
            "spec": s.speculative_steps / s.steps}


out = []
for c in classes:
    learned = {a: (Calibrator(CalibrationConfig(confidence=a == "confidence")), SuccessorTable()) for a in ARMS}
    for i, r in enumerate(parse_workload(f"{wl}/{c}.jsonl")[first : first + n]):
        rotated = ARMS[i % len(ARMS):] + ARMS[:i % len(ARMS)]  # who goes first alternates
        res = {arm: decode(r, arm, learned[arm]) for arm in rotated}
        row = {"cls": c, "id": r.id, "n": len(res[ARMS[0]]["ids"]),
               "same": all(res[a]["ids"] == res[ARMS[0]]["ids"] for a in ARMS),
               "speed": res["rates-only"]["dec"] / res["confidence"]["dec"]}
        for key in ("tps", "q", "spec"):
            row.update({f"{key} {a}": res[a][key] for a in ARMS})
        out.append(row)
        print(json.dumps(row), flush=True)


def gm(xs):
    return math.exp(statistics.fmean(math.log(x) for x in xs))


print(f"\n{'class':18s}{'same':>7}{'confidence/rates-only':>23}{'median':>8}{'min':>7}   tok/step   q/step  speculative steps")
for c in classes + ["all"]:
    rows = [x for x in out if c == "all" or x["cls"] == c]
    print(f"{c:18s}{sum(x['same'] for x in rows):>3}/{len(rows):<3}{gm([x['speed'] for x in rows]):>23.3f}"
          f"{statistics.median(x['speed'] for x in rows):>8.3f}{min(x['speed'] for x in rows):>7.3f}   "
          + "/".join(f"{statistics.fmean(x[f'tps {a}'] for x in rows):.2f}" for a in ARMS) + "  "
          + "/".join(f"{statistics.fmean(x[f'q {a}'] for x in rows):.2f}" for a in ARMS) + "  "
          + "/".join(f"{statistics.fmean(x[f'spec {a}'] for x in rows):.2f}" for a in ARMS))
print(json.dumps({c: gm([x["speed"] for x in out if c == "all" or x["cls"] == c]) for c in classes + ["all"]}))
