"""Replay (as replay_req.py) with an online logistic correction of each node's conditional over several features
together (its calibrated conditional, source, depth, the request's factor, the last step's accepted run, the
parent's conditional, siblings), trained by SGD per class on settled nodes: python replay_lr.py OUT.pkl"""
import collections, math, pickle, sys
import os
from lookahead.engine.allocator import allocate_batch, Candidates
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from replay_req import price  # noqa: E402  (this machine's stored bfloat16 curve)
def logit(p): p = min(max(p, 1e-4), 1 - 1e-4); return math.log(p / (1 - p))
def sig(z): return 1 / (1 + math.exp(-max(min(z, 30), -30)))
data = pickle.load(open(sys.argv[1], "rb"))
SRC = ["suffix", "recycle", "cache", "jacobi", "resume"]
def feats(t, n, cond, parcond, rq, last_acc, nsib):
    s = t.sources[n]; d = min(t.depths[n], 4)
    x = {"lc": logit(cond), "b": 1.0, f"s:{s}": 1.0, f"sd:{s}:{d}": 1.0, f"d:{d}": 1.0,
         "rq": rq, "acc": min(last_acc, 6) / 6, "lpc": logit(parcond), "sib": min(nsib, 4) / 4}
    return x
for lr in (0.001, 0.003, 0.008, 0.02, 0.05, 0.1):
  out = []
  for c, reqs in data.items():
    w = collections.defaultdict(float); w["lc"] = 1.0
    res = {"base": [0.0, 0.0], "lr": [0.0, 0.0]}
    for ids, log, _ in reqs:
        pending = []; pred = collections.defaultdict(float); real = collections.defaultdict(float); last_acc = 0
        for pos, t, probs in log:
            fut = ids[pos:]
            still = []
            for kk in pred: pred[kk] *= 0.8; real[kk] *= 0.8
            for at, x, h, s, cn in pending:
                if at < pos:
                    z = sum(w[k] * v for k, v in x.items()); g = sig(z) - h
                    for k, v in x.items(): w[k] -= lr * g * v
                    pred[s] += cn; real[s] += h
                else: still.append((at, x, h, s, cn))
            pending = still
            ok = {-1: True}; hits = []
            for n in range(len(t)):
                h = ok.get(t.parents[n], False) and t.depths[n] <= len(fut) and fut[t.depths[n] - 1] == t.tokens[n]
                ok[n] = h; hits.append(h)
            cond = []; nch = collections.Counter(t.parents)
            for n in range(len(t)):
                par = t.parents[n]; pp = probs[par] if par >= 0 else 1.0
                cond.append(min(probs[n] / pp, 1.0) if pp > 0 else 0.0)
            xs = []
            for n in range(len(t)):
                par = t.parents[n]; s = t.sources[n]
                rq = math.log((real[s] + 8) / (pred[s] + 8))
                xs.append(feats(t, n, cond[n], cond[par] if par >= 0 else 1.0, rq, last_acc, nch[par]))
            p2 = []
            for n in range(len(t)):
                par = t.parents[n]; base = p2[par] if par >= 0 else 1.0
                p2.append(base * sig(sum(w[k] * v for k, v in xs[n].items())))
            for arm, p in (("base", probs), ("lr", p2)):
                plan = allocate_batch([Candidates(t, p, 0, 0.0, False, None, 16)], price, max_width=16)[0]
                acc = max([t.depths[n] for n in plan.nodes if hits[n]], default=0)
                res[arm][0] += 1 + acc; res[arm][1] += plan.cost
                if arm == "base": last_acc = acc  # the logged run's own acceptance is unknown; use base's
            for n in range(len(t)):
                par = t.parents[n]
                if t.depths[n] > len(fut) or (par >= 0 and not hits[par]): continue
                pending.append((pos + t.depths[n] - 1, xs[n], float(hits[n]), t.sources[n], cond[n]))
    out.append(f"{c} {res['lr'][0]/res['lr'][1]/(res['base'][0]/res['base'][1]):.3f}")
  print("lr", lr, " ".join(out), flush=True)
