import pickle, sys, collections
data = [pickle.load(open(f, "rb")) for f in sys.argv[1:]]
b = collections.defaultdict(lambda: [0, 0, 0.0])
multi = collections.defaultdict(lambda: [0, 0])
for d in data:
    for s in d["steps"]:
        c = s["cand"]; t = c.tree; truth = d["answers"][s["req"]][s["L"]:s["L"] + 60]
        node, onpath = -1, set()
        for x in truth:
            nxt = t.children.get((node, x))
            if nxt is None: break
            onpath.add(nxt); node = nxt
        nchild = collections.Counter(t.parents)
        for i in range(len(t)):
            p = c.probs[i]
            if p >= 0.1: continue
            # parent on path? (only count nodes whose parent is right, i.e., reachable)
            par = t.parents[i]
            reach = par == -1 or par in onpath
            key = (t.sources[i], min(t.depths[i], 4), reach)
            e = b[key]; e[0] += 1; e[1] += i in onpath; e[2] += p
for k in sorted(b, key=lambda k: -b[k][1]):
    n, h, sp = b[k]
    if h >= 3: print(k, "nodes", n, "hits", h, f"hit {h/n:.3f} mean p {sp/n:.3f}")
