"""Replay the allocator on logged steps (log_confidence.py) with each node's conditional scaled by a
confidence factor per (source group, depth 1/2+, bucket) fitted in sample: python replay_fitted.py OUT.pkl"""
import pickle, sys, collections
from lookahead.engine.allocator import allocate_batch, Candidates
import lookahead.scheduler.scheduler  # noqa
def bucket(f):
    if f is None: return 0
    p = f[0]
    return 1 if p == 0 else 2 if p < .1 else 3 if p < .3 else 4 if p < .6 else 5 if p < .9 else 6
def grp(t, n):
    s = t.sources[n]; s = s if s in ("suffix", "recycle") else "other"
    return (s, min(t.depths[n], 2))
# typical bf16 curve (rows -> one-row passes) from the stored curve
CURVE = {1: 1.0, 2: 1.0551, 3: 1.0667, 4: 1.1752, 5: 1.17, 6: 1.157, 8: 1.2532, 12: 1.4803, 16: 1.699, 24: 2.0915, 32: 2.4066}
def price(k):
    ks = sorted(CURVE)
    for a, b in zip(ks, ks[1:]):
        if a <= k <= b: return CURVE[a] + (CURVE[b] - CURVE[a]) * (k - a) / (b - a)
    return CURVE[32] * k / 32
def steps_of(reqs):
    """Each logged step as (tree, probs, confidence features, the text that followed, per-node path hit)."""
    steps = []
    for ids, log in reqs:
        for pos, t, probs, feats in log:
            fut = ids[pos:]
            ok = {-1: True}; hits = []
            for n in range(len(t)):
                d = t.depths[n]
                h = ok.get(t.parents[n], False) and d <= len(fut) and fut[d-1] == t.tokens[n]
                ok[n] = h; hits.append(h)
            steps.append((t, probs, feats, fut, hits))
    return steps
if __name__ == "__main__":
  data = pickle.load(open(sys.argv[1], "rb"))
  for c, reqs in data.items():
      steps = steps_of(reqs)
      # fit factor: realised / calibrated conditional per (group, bucket), nodes whose parent was right
      pred = collections.Counter(); real = collections.Counter()
      for t, probs, feats, fut, hits in steps:
          for n in range(len(t)):
              par = t.parents[n]
              if t.depths[n] > len(fut) or (par >= 0 and not hits[par]): continue
              pp = probs[par] if par >= 0 else 1.0
              cond = min(probs[n] / pp, 1.0) if pp > 0 else 0.0
              k = (grp(t, n), bucket(feats[n]))
              pred[k] += cond; real[k] += hits[n]
      fac = {k: (real[k] + 1 * 0.3) / (pred[k] + 1) for k in pred}
      def run(adjust):
          tok = cost = rows = 0.0
          for t, probs, feats, fut, hits in steps:
              p = list(probs)
              if adjust:
                  cond = []
                  for n in range(len(t)):
                      par = t.parents[n]; pp = probs[par] if par >= 0 else 1.0
                      cond.append(min(probs[n] / pp, 1.0) if pp > 0 else 0.0)
                  for n in range(len(t)):
                      par = t.parents[n]
                      base = p[par] if par >= 0 else 1.0
                      p[n] = base * min(1.0, cond[n] * fac.get((grp(t, n), bucket(feats[n])), 1.0))
              plan = allocate_batch([Candidates(t, p, 0, 0.0, False, None, 16)], price, max_width=16, max_rows=None)[0]
              acc = max([t.depths[n] for n in plan.nodes if hits[n]], default=0)
              tok += 1 + acc; cost += plan.cost; rows += plan.width
          return tok / cost, tok / len(steps), rows / len(steps)
      a, b = run(False), run(True)
      print(f"{c}: orig {a[0]:.3f} tok/cost ({a[1]:.2f} tok/step, {a[2]:.2f} rows)  confidence {b[0]:.3f} ({b[1]:.2f}, {b[2]:.2f}) -> {b[0]/a[0]:.3f}x")
      print("   factors", {f"{k[0][0][:3]}{k[0][1]}b{k[1]}": round(v, 2) for k, v in sorted(fac.items())})
