"""Replay the allocator on logged steps (log_confidence.py) with each node's conditional scaled by a
confidence factor per (source, depth 1/2+, bucket) learned online in step order: python replay_online.py OUT.pkl"""
import collections, os, pickle, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lookahead.engine.allocator import allocate_batch, Candidates
from replay_fitted import bucket, price, steps_of  # noqa: E402
data = pickle.load(open(sys.argv[1], "rb"))
def grp(t, n):
    return (t.sources[n], min(t.depths[n], 2))
for decay in (0.98, 0.995, 1.0):
  tot = collections.Counter()
  for c, reqs in data.items():
    pred = collections.defaultdict(float); real = collections.defaultdict(float)
    res = {False: [0, 0], True: [0, 0]}
    for t, probs, feats, fut, hits in steps_of(reqs):
            cond = []
            for n in range(len(t)):
                par = t.parents[n]; pp = probs[par] if par >= 0 else 1.0
                cond.append(min(probs[n] / pp, 1.0) if pp > 0 else 0.0)
            for adjust in (False, True):
                p = list(probs)
                if adjust:
                    for n in range(len(t)):
                        par = t.parents[n]; base = p[par] if par >= 0 else 1.0
                        k = (grp(t, n), bucket(feats[n]))
                        f = (real[k] + 3) / (pred[k] + 3)
                        p[n] = base * min(1.0, cond[n] * f)
                plan = allocate_batch([Candidates(t, p, 0, 0.0, False, None, 16)], price, max_width=16)[0]
                acc = max([t.depths[n] for n in plan.nodes if hits[n]], default=0)
                res[adjust][0] += 1 + acc; res[adjust][1] += plan.cost
            for n in range(len(t)):  # learn: every node whose parent was right, once settled
                par = t.parents[n]
                if t.depths[n] > len(fut) or (par >= 0 and not hits[par]): continue
                k = (grp(t, n), bucket(feats[n]))
                pred[k] = decay * pred[k] + cond[n]; real[k] = decay * real[k] + hits[n]
    a, b = res[False][0] / res[False][1], res[True][0] / res[True][1]
    tot["a"] += a; tot["b"] += b
    print(f"decay {decay} {c}: {b/a:.3f}x")
