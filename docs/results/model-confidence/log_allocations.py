"""Log each step's allocator input, then replay the allocator with altered probabilities offline."""
import sys, collections, pickle, torch, lookahead
from dataclasses import replace
from lookahead.generation import generate
from lookahead.engine.calibration import Calibrator
from lookahead.candidates.recycling import SuccessorTable
from lookahead.workloads.format import parse_workload
import lookahead.scheduler.request as rq
import lookahead.scheduler.scheduler as sch
torch.set_num_threads(2)
WL = __import__("os").environ.get("WL", "workloads")  # lookahead workloads build folder
M = lookahead.load("smollm2-135m-instruct", dtype="bfloat16")
LOG = []; FLAG = [False]; POS = [0]
oa = sch.allocate_batch
def alloc(wanted, price, **kw):
    out = oa(wanted, price, **kw)
    if FLAG[0]:
        FLAG[0] = False
        w = wanted[0]
        prices = {k: price(k) for k in range(1, 65)}
        views = kw.get("views_cost")
        vp = {k: views(k) for k in range(1, 65)} if views else None
        LOG.append(dict(pos=POS[0], tree=w.tree, probs=list(w.probs), aux_rows=w.aux_rows, aux_value=w.aux_value,
                        chain_only=w.chain_only, fixed=w.fixed, max_width=w.max_width, kw={k: v for k, v in kw.items() if k != "views_cost"},
                        prices=prices, vprices=vp, plan=out[0]))
    return out
sch.allocate_batch = alloc
ostep = sch.Scheduler.step
def step(self):
    FLAG[0] = True
    r = self.active[0]; POS[0] = len(r.context) - len(r.prompt_ids)
    return ostep(self)
sch.Scheduler.step = step
data = {}
for c in sys.argv[1].split(","):
    cal, suc = Calibrator(), SuccessorTable()
    reqs = []
    for r in parse_workload(f"{WL}/{c}.jsonl")[30:30 + int(sys.argv[2])]:
        LOG.clear()
        g = generate(M, r.chat() if r.prompt is None else r.prompt, raw=r.prompt is not None, max_new_tokens=128, calibrator=cal, successors=suc, prefix_cache=False)
        reqs.append((g.token_ids, list(LOG), g.stats.steps))
    data[c] = reqs
    print(c, sum(len(x[1]) for x in reqs), sum(x[2] for x in reqs), flush=True)
pickle.dump(data, open(sys.argv[3], "wb"))
