"""Log each step's allocator input (tree, path probabilities) and each request's final ids, per class sharing one
calibrator and one successor table as the bench does:
    WL=<lookahead workloads build folder> python log_steps.py chat,code,function_calling,math,summarization 12 30 OUT.pkl"""
import os, sys, pickle, torch, lookahead
from lookahead.generation import generate
from lookahead.engine.calibration import Calibrator
from lookahead.candidates.recycling import SuccessorTable
from lookahead.workloads.format import parse_workload
import lookahead.scheduler.request as rq
torch.set_num_threads(2)
M = lookahead.load("smollm2-135m-instruct", dtype="bfloat16")
LOG = []
op = rq.Request.propose
def propose(self, *a, **k):
    c = op(self, *a, **k)
    LOG.append((len(self.context) - len(self.prompt_ids), c.tree, list(c.probs)))
    return c
rq.Request.propose = propose
out = {}
n, first = int(sys.argv[2]), int(sys.argv[3])
for c in sys.argv[1].split(","):
    cal, suc = Calibrator(), SuccessorTable()
    reqs = []
    for r in parse_workload(f"{os.environ.get('WL', 'workloads')}/{c}.jsonl")[first:first + n]:
        LOG.clear()
        g = generate(M, r.chat() if r.prompt is None else r.prompt, raw=r.prompt is not None, max_new_tokens=128,
                     calibrator=cal, successors=suc, prefix_cache=False)
        reqs.append((g.token_ids, list(LOG), g.stats.tokens_per_step))
    out[c] = reqs
    print(c, sum(x[2] for x in reqs) / len(reqs), flush=True)
pickle.dump(out, open(sys.argv[4], "wb"))
