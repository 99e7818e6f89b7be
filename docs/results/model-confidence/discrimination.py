import pickle, sys, collections
data = pickle.load(open(sys.argv[1], "rb"))
def bucket(f):
    if f is None: return "none"
    p = f[0]
    return "0" if p == 0 else "<.1" if p < .1 else "<.3" if p < .3 else "<.6" if p < .6 else "<.9" if p < .9 else ">=.9"
ORDER = ["none", "0", "<.1", "<.3", "<.6", "<.9", ">=.9"]
for c, reqs in data.items():
    tab = collections.defaultdict(lambda: [0, 0, 0.0])
    for ids, log in reqs:
        for pos, t, probs, feats in log:
            fut = ids[pos:]
            ok = {-1: True}
            for n in range(len(t)):
                d = t.depths[n]
                if d > len(fut): continue
                par_ok = ok.get(t.parents[n], False)
                hit = par_ok and fut[d-1] == t.tokens[n]
                ok[n] = hit
                if not par_ok: continue
                pp = probs[t.parents[n]] if t.parents[n] >= 0 else 1.0
                cond = probs[n] / pp if pp > 0 else 0.0
                src = t.sources[n] if t.sources[n] in ("suffix", "recycle") else "other"
                for key in ((src, "d1" if d == 1 else "d2+", bucket(feats[n])), ("all", "all", bucket(feats[n]))):
                    e = tab[key]; e[0] += 1; e[1] += hit; e[2] += min(cond, 1.0)
    print("==", c)
    for key in sorted(tab, key=lambda k: (k[0], k[1], ORDER.index(k[2]))):
        n, h, pc = tab[key]
        if n >= 20: print(f"  {key[0]:8s} {key[1]:4s} p_model {key[2]:5s}: n {n:5d} accepted|parent {h/n:.3f}  calibrated cond {pc/n:.3f}")
