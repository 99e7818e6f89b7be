import pickle, sys
data = [pickle.load(open(f, "rb")) for f in sys.argv[1:]]
tok = cost = 0.0; n = 0
for d in data:
    for s in d["steps"]:
        c = s["cand"]; truth = d["answers"][s["req"]][s["L"]:s["L"] + 60]
        node, f = -1, 0
        for t in truth:
            nxt = c.tree.children.get((node, t))
            if nxt is None: break
            node = nxt; f += 1
        w = 1 + f
        price = min(s["prices"][w - 1:])
        tok += 1 + f; cost += price; n += 1
print(f"oracle (verify exactly the true path): tok/step {tok/n:.3f} tokens per cost {tok/cost:.4f}")
