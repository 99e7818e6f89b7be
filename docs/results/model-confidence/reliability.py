"""Reliability of the tree's node probabilities: predicted vs realised P(path accepted), by depth and source."""
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
op = rq.Request.propose
def propose(self, *a, **k):
    c = op(self, *a, **k)
    LOG.append((len(self.context) - len(self.prompt_ids), self.draft.tree, list(c.probs)))
    return c
rq.Request.propose = propose
for c in sys.argv[1].split(","):
    cal, suc = Calibrator(), SuccessorTable()
    bins = collections.defaultdict(lambda: [0.0, 0, 0])  # pred sum, hits, n
    for r in parse_workload(f"{WL}/{c}.jsonl")[30:30 + int(sys.argv[2])]:
        LOG.clear()
        g = generate(M, r.chat() if r.prompt is None else r.prompt, raw=r.prompt is not None, max_new_tokens=128, calibrator=cal, successors=suc, prefix_cache=False)
        ids = g.token_ids
        for pos, tree, probs in LOG:
            fut = ids[pos:]
            ok = {-1: True}
            for n in range(len(tree)):
                d = tree.depths[n]
                hit = ok.get(tree.parents[n], False) and d <= len(fut) and fut[d-1] == tree.tokens[n]
                ok[n] = hit
                if d > len(fut): continue
                p = probs[n]
                for key in ((min(d, 5), "all", min(int(p * 10), 9)), (min(d,5), tree.sources[n], -1)):
                    b = bins[key]; b[0] += p; b[1] += hit; b[2] += 1
    print("==", c)
    for key in sorted(bins, key=lambda k: (k[1], k[0], k[2])):
        ps, h, n = bins[key]
        if n >= 30: print(f"  depth {key[0]} {key[1]:8s} bin {key[2]:2d}: n {n:6d} predicted {ps/n:.3f} realised {h/n:.3f}")
