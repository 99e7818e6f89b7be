import pickle, sys
from dataclasses import replace
from lookahead.engine import allocator as A
def walk(tree, nodes, truth):
    chosen = set(nodes); node, d = -1, 0
    for t in truth:
        nxt = tree.children.get((node, t))
        if nxt is None or nxt not in chosen: break
        node = nxt; d += 1
    return d
def rule_alloc(cand, prices, lam, max_width, max_rows):
    # same per-width best allocations as the allocator; pick the width by E - lam*c (lam None: E/c)
    most = max(1, min(max_width, max_width))
    most = max(1, min(most, 1 + len(cand.tree) + cand.aux_rows))
    chains = A._best_within(cand, most, branches=False)
    trees = chains if cand.chain_only else A._best_within(cand, most, branches=True)
    best = None
    for w in range(1, most + 1):
        for kind in ((chains,) if trees is chains else (chains, trees)):
            o = kind[w]; price = prices[w - 1]
            score = o.expected / price if lam is None else o.expected - lam * price
            if best is None or score > best[0] + 1e-12:
                best = (score, o, price)
    return best[1], best[2]
files = sys.argv[1:]
data = [pickle.load(open(f, "rb")) for f in files]
for lam in [None, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0]:
    tok = cost = rows = 0.0; n = 0
    for d in data:
        for s in d["steps"]:
            c = s["cand"]; truth = d["answers"][s["req"]][s["L"]:s["L"] + 40]
            o, price = rule_alloc(c, s["prices"], lam, s["max_width"], s["max_rows"])
            acc = walk(c.tree, o.nodes, truth)
            tok += 1 + acc; cost += price; rows += o.width; n += 1
    print(f"lam={lam}: steps {n} tok/step {tok/n:.3f} rows/step {rows/n:.2f} cost/step {cost/n:.3f} tokens per cost {tok/cost:.4f}")
print("calibration check: every offered node, by calibrated path probability (hit: on the path the model took)")
import collections
b = collections.defaultdict(lambda: [0, 0.0, 0])
for d in data:
    for s in d["steps"]:
        c = s["cand"]; truth = d["answers"][s["req"]][s["L"]:s["L"] + 40]
        o, price = rule_alloc(c, s["prices"], None, s["max_width"], s["max_rows"])
        acc = walk(c.tree, o.nodes, truth)
        # which nodes are on the true path
        node, onpath = -1, set()
        for t in truth:
            nxt = c.tree.children.get((node, t))
            if nxt is None: break
            onpath.add(nxt); node = nxt
        for nd in range(len(c.tree)):
            p = c.probs[nd]; k = min(int(p * 10), 9)
            e = b[k]; e[0] += 1; e[1] += p; e[2] += nd in onpath
for k in sorted(b):
    n, sp, hit = b[k]
    print(f"  p in [{k/10:.1f},{(k+1)/10:.1f}): nodes {n} mean p {sp/n:.3f} hit {hit/n:.3f}")
