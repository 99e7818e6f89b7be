"""Does the model's (recycled) probability of a node's token, from the newest row for its parent token,
discriminate which nodes are accepted (given the parent was)?"""
import sys, collections, math, pickle, torch, lookahead
from lookahead.generation import generate
from lookahead.engine.calibration import Calibrator
from lookahead.candidates.recycling import SuccessorTable
from lookahead.workloads.format import parse_workload
import lookahead.scheduler.request as rq
import lookahead.engine.step as st
import lookahead.candidates.pool as pool
torch.set_num_threads(2)
WL = __import__("os").environ.get("WL", "workloads")  # lookahead workloads build folder
M = lookahead.load("smollm2-135m-instruct", dtype="bfloat16")
TOP = []
ol = st.largest
def largest(x, k):
    r = ol(x, k); TOP.append(r.values.float()); return r
st.largest = largest
VALS2, VALS1 = {}, {}
ou = pool.SourcePool.update
def update(self, context, outcome):
    if TOP and outcome.successors:
        v = TOP[-1]
        before = outcome.predecessors if len(outcome.predecessors) == len(outcome.successors) else [()] * len(outcome.successors)
        for i, ((tok, nxt), prev) in enumerate(zip(outcome.successors, before)):
            lv = v[i].tolist(); m = max(lv); e = [math.exp(a - m) for a in lv]; s = sum(e)
            d = {t: x / s for t, x in zip(nxt, e)}
            d["_m"] = lv[0] - lv[1] if len(lv) > 1 else 0
            VALS1[tok] = d
            if prev: VALS2[(prev[-1], tok)] = d
    TOP.clear()
    return ou(self, context, outcome)
pool.SourcePool.update = update
LOG = []
op = rq.Request.propose
def propose(self, *a, **k):
    c = op(self, *a, **k)
    t = self.draft.tree; ctx = self.context
    feats = []
    for n in range(len(t)):
        par = t.parents[n]
        pt = ctx[-1] if par < 0 else t.tokens[par]
        pp = (ctx[-2] if len(ctx) > 1 else None) if par < 0 else (ctx[-1] if t.parents[par] < 0 else t.tokens[t.parents[par]])
        d = VALS2.get((pp, pt)) or VALS1.get(pt)
        feats.append(None if d is None else (d.get(t.tokens[n], 0.0), d["_m"], max(d, key=lambda z: -1 if z == "_m" else d[z]) == t.tokens[n]))
    LOG.append((len(ctx) - len(self.prompt_ids), t, list(c.probs), feats))
    return c
rq.Request.propose = propose
out = {}
for c in sys.argv[1].split(","):
    cal, suc = Calibrator(), SuccessorTable(); VALS1.clear(); VALS2.clear()
    reqs = []
    for r in parse_workload(f"{WL}/{c}.jsonl")[30:30 + int(sys.argv[2])]:
        LOG.clear()
        g = generate(M, r.chat() if r.prompt is None else r.prompt, raw=r.prompt is not None, max_new_tokens=128, calibrator=cal, successors=suc, prefix_cache=False)
        reqs.append((g.token_ids, list(LOG)))
    out[c] = reqs
    print(c, flush=True)
pickle.dump(out, open(sys.argv[3], "wb"))
