"""Logs every lookahead step of N requests per class: the whole offered tree (tokens, parents, depths,
sources), the path probabilities before and after the request's realization factor, and what the allocator
verified; pickled with each answer. Usage: WL=<workloads> python reliability.py CLASSES N SKIP OUT.pkl
(run: code,chat,function_calling,math,summarization,high_entropy 6 40 steps.pkl; the pickle is not kept)."""
import os, sys, pickle
import torch, lookahead
from lookahead.config import SamplingConfig
from lookahead.generation import generate
from lookahead.engine.calibration import Calibrator
from lookahead.candidates.recycling import SuccessorTable
from lookahead.workloads.format import parse_workload
import lookahead.scheduler.request as rq
torch.set_num_threads(2)
WL = os.environ.get("WL", "workloads")
M = lookahead.load("smollm2-135m-instruct", dtype="bfloat16")
orig_propose, orig_item = rq.Request.propose, rq.Request.item
LOG = []
def propose(self, *a, **k):
    c = orig_propose(self, *a, **k)
    LOG.append(dict(req=id(self), pos=len(self.context), parents=list(c.tree.parents), tokens=list(c.tree.tokens),
                    depths=list(c.tree.depths), probs=list(c.probs), raw=list(c.tree.probs),
                    sources=list(getattr(c.tree, "sources", [])), aux=c.aux_rows, auxv=c.aux_value, rate=getattr(c, "rate", None)))
    return c
def item(self, plan):
    LOG[-1]["plan"] = list(plan.nodes); LOG[-1]["w"] = plan.width; LOG[-1]["planaux"] = plan.aux
    return orig_item(self, plan)
rq.Request.propose, rq.Request.item = propose, item
classes = sys.argv[1].split(","); n = int(sys.argv[2]); start = int(sys.argv[3])
runs = []
for c in classes:
    cal, suc = Calibrator(), SuccessorTable()
    for r in parse_workload(f"{WL}/{c}.jsonl")[start:start + n]:
        samp = SamplingConfig(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, seed=r.effective_seed)
        LOG.clear()
        prompt = r.chat() if r.prompt is None else r.prompt
        g = generate(M, prompt, raw=r.prompt is not None, max_new_tokens=128, sampling=samp, calibrator=cal, successors=suc)
        plen = g.stats.prompt_tokens
        runs.append(dict(cls=c, steps=list(LOG), out=g.token_ids, plen=plen))
pickle.dump(runs, open(sys.argv[4], "wb"))
