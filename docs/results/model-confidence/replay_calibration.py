import pickle, sys, collections
from lookahead.engine.allocator import allocate_batch, Candidates
data = pickle.load(open(sys.argv[1], "rb"))
def hits(tree, fut):
    ok = {-1: True}; out = []
    for n in range(len(tree)):
        d = tree.depths[n]
        h = ok.get(tree.parents[n], False) and d <= len(fut) and fut[d-1] == tree.tokens[n]
        ok[n] = h; out.append(h)
    return out
def run(steps, transform):
    tok = cost = rows = 0.0
    for s, fut, hit in steps:
        tree = s["tree"]
        probs = transform(s, hit)
        # keep monotone: child <= parent
        probs = list(probs)
        for n in range(len(tree)):
            p = tree.parents[n]
            if p >= 0: probs[n] = min(probs[n], probs[p])
        cand = Candidates(tree, probs, s["aux_rows"], s["aux_value"], s["chain_only"], s["fixed"], s["max_width"])
        pr = s["prices"]
        plan = allocate_batch([cand], lambda k: pr[min(k, 64)], **s["kw"])[0]
        sel = set(plan.nodes)
        acc = max([tree.depths[n] for n in plan.nodes if hit[n]], default=0)
        tok += 1 + acc; cost += plan.cost; rows += plan.width
    return tok / cost, tok / len(steps), rows / len(steps)
for c, reqs in data.items():
    steps = []
    for ids, log, _ in reqs:
        for s in log:
            fut = ids[s["pos"]:]
            steps.append((s, fut, hits(s["tree"], fut)))
    # per depth realised / predicted
    pred = collections.Counter(); real = collections.Counter()
    for s, fut, hit in steps:
        for n, p in enumerate(s["probs"]):
            d = min(s["tree"].depths[n], 7)
            if s["tree"].depths[n] <= len(fut): pred[d] += p; real[d] += hit[n]
    scale = {d: real[d] / pred[d] for d in pred}
    base = run(steps, lambda s, h: s["probs"])
    out = {"orig": base}
    out["depth-scaled"] = run(steps, lambda s, h: [min(1, p * scale[min(s["tree"].depths[n], 7)]) for n, p in enumerate(s["probs"])])
    for g in (0.8, 0.9):
        out[f"pow{g}"] = run(steps, lambda s, h, g=g: [p ** g for p in s["probs"]])
    out["oracle"] = run(steps, lambda s, h: [1.0 if x else 0.0 for x in h])
    print(c, "scale", {d: round(v, 2) for d, v in sorted(scale.items())})
    for k, v in out.items():
        print(f"  {k:14s} tokens/cost {v[0]:.3f} ({v[0]/base[0]:.3f}x) tokens/step {v[1]:.2f} rows {v[2]:.2f}")
