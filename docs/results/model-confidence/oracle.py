"""Per step: accepted run in the allocated tree vs the best run in the whole proposed tree (greedy)."""
import sys, collections, torch, lookahead
from lookahead.generation import generate
from lookahead.engine.calibration import Calibrator
from lookahead.candidates.recycling import SuccessorTable
from lookahead.workloads.format import parse_workload
import lookahead.scheduler.request as rq
torch.set_num_threads(2)
WL = __import__("os").environ.get("WL", "workloads")  # lookahead workloads build folder
M = lookahead.load("smollm2-135m-instruct", dtype="bfloat16")
LOG = []
op, oi = rq.Request.propose, rq.Request.item
def propose(self, *a, **k):
    c = op(self, *a, **k)
    t = self.draft.tree
    LOG.append([len(self.context), t, None, len(self.prompt_ids)])
    return c
def item(self, plan):
    LOG[-1][2] = list(plan.nodes) if self.draft.calibrated else list(range(len(self.draft.tree)))
    return oi(self, plan)
rq.Request.propose, rq.Request.item = propose, item
def best(tree, nodes, future):
    ok = {-1: 0}; b = 0
    for n in nodes:
        p = tree.parents[n]
        if p in ok and tree.depths[n] <= len(future) and future[tree.depths[n]-1] == tree.tokens[n]:
            ok[n] = tree.depths[n]; b = max(b, ok[n])
    return b
for c in sys.argv[1].split(","):
    cal, suc = Calibrator(), SuccessorTable()
    agg = collections.Counter()
    for r in parse_workload(f"{WL}/{c}.jsonl")[30:30 + int(sys.argv[2])]:
        LOG.clear()
        g = generate(M, r.chat() if r.prompt is None else r.prompt, raw=r.prompt is not None, max_new_tokens=128, calibrator=cal, successors=suc, prefix_cache=False)
        full = LOG[0][3] if LOG else 0
        seq = None
        for ctx, tree, alloc, plen in LOG:
            seq = seq or None
        ids = g.token_ids
        for ctx, tree, alloc, plen in LOG:
            pos = ctx - plen  # tokens generated so far; root = last context token
            fut = ids[pos:]
            a = best(tree, alloc or [], fut); f = best(tree, range(len(tree)), fut)
            agg["steps"] += 1; agg["alloc"] += a; agg["full"] += f; agg["nodes_full"] += len(tree); agg["nodes_alloc"] += len(alloc or [])
            agg["miss_steps"] += f > a
            if f > a:
                # the deepest accepted node of the whole tree and its ancestors: which were allocated?
                ok = {-1: 0}; deep = None
                for n in range(len(tree)):
                    p = tree.parents[n]
                    if p in ok and tree.depths[n] <= len(fut) and fut[tree.depths[n]-1] == tree.tokens[n]:
                        ok[n] = tree.depths[n]
                        if deep is None or ok[n] > ok[deep]: deep = n
                chain = []
                n = deep
                while n >= 0: chain.append(n); n = tree.parents[n]
                chain.reverse()
                al = set(alloc or [])
                inside = sum(1 for n in chain if n in al)
                kind = "truncated" if inside and inside == a else ("wrong_branch" if inside == 0 else "other")
                agg[kind] += 1; agg[kind + "_gain"] += f - a
                agg["src_" + tree.sources[chain[0]]] += f - a
                rank = sorted(range(len(tree)), key=lambda i: -tree.probs[i]).index(chain[0])
                agg["rank_sum"] += rank
    s = agg["steps"]
    print({k: (round(v/s,3) if 'gain' in k or k.startswith('src') else v) for k, v in agg.items()})
    print(f"{c}: steps {s} accepted/step alloc {agg['alloc']/s:.2f} full-tree {agg['full']/s:.2f}; nodes alloc {agg['nodes_alloc']/s:.1f} full {agg['nodes_full']/s:.1f}; steps where full>alloc {agg['miss_steps']/s:.1%}", flush=True)
