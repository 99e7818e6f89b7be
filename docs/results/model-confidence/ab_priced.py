"""A/B of the model's confidence in guessed tokens with the cost curve frozen at its stored prices (no online
timing refinement): each arm's allocations are then a deterministic function of its guesses and what its
calibrator learned, so tokens per unit of priced step cost compare the arms without timing noise. Arms:
"rates-only" (CalibrationConfig(confidence=False)) and "confidence" (the default), each with its own
calibrator and recycled successors per class; outputs checked identical.

    WL=<lookahead workloads build folder> python ab_priced.py CLASSES N FIRST
"""
import json, math, os, statistics, sys, torch, lookahead
from lookahead.candidates.recycling import SuccessorTable
from lookahead.config import SamplingConfig
from lookahead.engine.calibration import CalibrationConfig, Calibrator
from lookahead.engine.costs import CostCurve
from lookahead.generation import generate
from lookahead.workloads.format import parse_workload
import lookahead.scheduler.scheduler as sch
torch.set_num_threads(2)
M = lookahead.load("smollm2-135m-instruct", dtype="bfloat16")
CostCurve.observe = lambda self, *a, **k: None  # frozen at the stored curve
ACC = {"cost": 0.0}
ostep = sch.Scheduler.step
def step(self):
    ev = ostep(self)
    ACC["cost"] += self.curve(self.last.rows)
    return ev
sch.Scheduler.step = step
ARMS = ["rates-only", "confidence"]
classes, n, first = sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3])
wl = os.environ.get("WL", "workloads")
out = []
for c in classes:
    learned = {a: (Calibrator(CalibrationConfig(confidence=a == "confidence")), SuccessorTable()) for a in ARMS}
    for r in parse_workload(f"{wl}/{c}.jsonl")[first:first + n]:
        res = {}
        for a in ARMS:
            ACC["cost"] = 0.0
            s = SamplingConfig(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, seed=r.effective_seed)
            g = generate(M, r.chat() if r.prompt is None else r.prompt, raw=r.prompt is not None, max_new_tokens=128,
                         sampling=s, calibrator=learned[a][0], successors=learned[a][1], prefix_cache=False)
            res[a] = (g.token_ids, len(g.token_ids), ACC["cost"], g.stats.steps, g.stats.processed_tokens)
        out.append((c, res[ARMS[0]][0] == res[ARMS[1]][0], {a: res[a][1:] for a in ARMS}))
for c in classes + ["all"]:
    rows = [x for x in out if c == "all" or x[0] == c]
    t = {a: sum(x[2][a][0] for x in rows) for a in ARMS}
    cost = {a: sum(x[2][a][1] for x in rows) for a in ARMS}
    steps = {a: sum(x[2][a][2] for x in rows) for a in ARMS}
    q = {a: sum(x[2][a][3] for x in rows) for a in ARMS}
    ratio = (t["confidence"] / cost["confidence"]) / (t["rates-only"] / cost["rates-only"])
    print(f"{c:18s} same {sum(x[1] for x in rows)}/{len(rows)}  tokens per priced cost confidence/rates-only {ratio:.3f}  "
          f"tok/step {t['rates-only']/steps['rates-only']:.2f}/{t['confidence']/steps['confidence']:.2f}  rows/step {q['rates-only']/steps['rates-only']:.2f}/{q['confidence']/steps['confidence']:.2f}", flush=True)
