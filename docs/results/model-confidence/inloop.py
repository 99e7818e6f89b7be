import sys, collections, statistics, torch, lookahead
from lookahead.generation import generate
from lookahead.engine.calibration import Calibrator
from lookahead.candidates.recycling import SuccessorTable
from lookahead.workloads.format import parse_workload
import lookahead.scheduler.scheduler as sch
torch.set_num_threads(2)
WL = __import__("os").environ.get("WL", "workloads")  # lookahead workloads build folder
M = lookahead.load("smollm2-135m-instruct", dtype="bfloat16")
REC = []
ostep = sch.Scheduler.step
def step(self):
    n0 = len(self.active[0].context)
    ev = ostep(self)
    REC.append((self.last.rows, self.last.forward_s, n0, self.curve(self.last.rows) if hasattr(self, "curve") else None))
    return ev
sch.Scheduler.step = step
for s in ("autoregressive", "lookahead"):
    REC.clear()
    cal, suc = Calibrator(), SuccessorTable()
    for c in sys.argv[1].split(","):
        for r in parse_workload(f"{WL}/{c}.jsonl")[30:30 + int(sys.argv[2])]:
            generate(M, r.chat() if r.prompt is None else r.prompt, raw=r.prompt is not None, max_new_tokens=128, strategy=s, prefix_cache=False, calibrator=cal, successors=suc)
    by = collections.defaultdict(list)
    for rows, f, n0, price in REC:
        by[rows].append((f, n0, price))
    if s == "autoregressive":
        base = statistics.median(f for v in by.values() for f, _, _ in v)
        print("AR median forward ms", round(1e3 * base, 2), "rows", sorted(by))
    else:
        for w in sorted(by):
            v = by[w]
            print(f"  rows {w:2d}: steps {len(v):4d} median fwd {1e3*statistics.median(f for f,_,_ in v):5.1f} ms = {statistics.median(f for f,_,_ in v)/base:.2f} x AR; priced {statistics.median(p for _,_,p in v):.2f}; context {statistics.median(n for _,n,_ in v):.0f}")
