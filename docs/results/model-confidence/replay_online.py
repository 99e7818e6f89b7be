import pickle, sys, collections
from lookahead.engine.allocator import allocate_batch, Candidates
data = pickle.load(open(sys.argv[1], "rb"))
def bucket(f):
    if f is None: return 0
    p = f[0]
    return 1 if p == 0 else 2 if p < .1 else 3 if p < .3 else 4 if p < .6 else 5 if p < .9 else 6
def grp(t, n):
    return (t.sources[n], min(t.depths[n], 2))
CURVE = {1: 1.0, 2: 1.0551, 3: 1.0667, 4: 1.1752, 5: 1.17, 6: 1.157, 8: 1.2532, 12: 1.4803, 16: 1.699, 24: 2.0915, 32: 2.4066}
def price(k):
    ks = sorted(CURVE)
    for a, b in zip(ks, ks[1:]):
        if a <= k <= b: return CURVE[a] + (CURVE[b] - CURVE[a]) * (k - a) / (b - a)
    return CURVE[32] * k / 32
for decay in (0.98, 0.995, 1.0):
  tot = collections.Counter()
  for c, reqs in data.items():
    pred = collections.defaultdict(float); real = collections.defaultdict(float)
    res = {False: [0, 0], True: [0, 0]}
    for ids, log in reqs:
        for pos, t, probs, feats in log:
            fut = ids[pos:]
            ok = {-1: True}; hits = []
            for n in range(len(t)):
                d = t.depths[n]
                h = ok.get(t.parents[n], False) and d <= len(fut) and fut[d-1] == t.tokens[n]
                ok[n] = h; hits.append(h)
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
