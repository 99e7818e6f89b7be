import os
WL = os.environ.get("WL", "workloads")  # lookahead workloads build --out workloads
OUTS = os.environ.get("OUTS", "answers.jsonl")  # gen.py writes the greedy answers here
import json, sys, torch, collections
import lookahead
from lookahead.generation import generate
import lookahead.scheduler.request as RQ
torch.set_num_threads(2)
cls = sys.argv[1]; n = int(sys.argv[2]); skip = int(sys.argv[3]) if len(sys.argv) > 3 else 0
m = lookahead.load("smollm2-135m-instruct")
reqs = [json.loads(l) for l in open(f"{WL}/{cls}.jsonl")][:n]
log = []
op, oi = RQ.Request.propose, RQ.Request.item
def propose(self, *a, **k):
    c = op(self, *a, **k); log.append([len(self.context), c.tree, None, self.prompt_ids]); return c
def item(self, plan):
    it = oi(self, plan); log[-1][2] = it.draft.tree; return it
RQ.Request.propose, RQ.Request.item = propose, item
def walk(tree, truth):
    node, d, srcs = -1, 0, []
    for t in truth:
        nxt = tree.children.get((node, t))
        if nxt is None: break
        node = nxt; d += 1; srcs.append(tree.sources[nxt])
    return d, srcs
tot = collections.Counter(); miss_src = collections.Counter(); hist = collections.Counter()
for i, r in enumerate(reqs):
    log.clear()
    g = generate(m, r["messages"], max_new_tokens=128, strategy="lookahead")
    if i < skip: continue
    full = log[0][3] + g.token_ids
    for L, tree, alloc, _ in log:
        truth = full[L:L+20]
        a, _ = walk(alloc, truth); f, srcs = walk(tree, truth)
        tot['steps'] += 1; tot['alloc'] += a; tot['full'] += f; tot['alloc_rows'] += len(alloc); tot['full_rows'] += len(tree)
        if f > a:
            hist[(a, f)] += 1
            for s in srcs[a:]: miss_src[s] += 1
    print(r.get('id', i), g.stats.tokens_per_step, flush=True)
s = tot['steps']
print(cls, 'steps', s, 'alloc tok/step %.3f full %.3f' % (1 + tot['alloc']/s, 1 + tot['full']/s), 'rows alloc %.1f full %.1f' % (tot['alloc_rows']/s, tot['full_rows']/s))
print('missed by source', dict(miss_src))
print('top (alloc, full) misses', hist.most_common(12))

from lookahead.engine.calibration import shared_calibrator
rep=shared_calibrator(m.model,'lookahead/greedy').report()
import re
tab=collections.defaultdict(dict)
for k,v in rep.items():
    src,f,d=k.split('/')
    if src=='suffix': tab[int(f)][int(d)]=(v['rate'],v['reached'])
for f in sorted(tab):
    print('f%2d L%d s%d'%(f,f//3,f%3), ' '.join('%d:%.2f(%.0f)'%(d,r,n) for d,(r,n) in sorted(tab[f].items()) if d<=12))
