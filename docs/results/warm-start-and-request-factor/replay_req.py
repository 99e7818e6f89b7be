"""Replay the allocator on steps log_steps.py logged, with each node's conditional scaled by a factor learned
within the request (or after a step that accepted all it verified: "streak"); a node is scored only once the
text has reached its position. "oracle": verify exactly the right nodes.  python replay_req.py OUT.pkl
CURVE: this machine's stored bfloat16 curve (rows -> one-row passes)."""
import collections, pickle, sys
from lookahead.engine.allocator import allocate_batch, Candidates
CURVE = {1: 1.0, 2: 1.05, 3: 1.07, 4: 1.11, 6: 1.19, 8: 1.29, 12: 1.62, 16: 1.79}
def price(k):
    ks = sorted(CURVE)
    if k <= 1: return 1.0
    for a, b in zip(ks, ks[1:]):
        if a <= k <= b: return CURVE[a] + (CURVE[b] - CURVE[a]) * (k - a) / (b - a)
    return CURVE[16] * k / 16
def key_sd(t, n): return (t.sources[n], min(t.depths[n], 2))
def key_s(t, n): return t.sources[n]
def key_1(t, n): return 0
ARMS = {"base": None, "streak cls k3": ("streak", 3), "streak req k3": ("streakreq", 3), "src+depth k3": (key_sd, 3), "src+depth k8": (key_sd, 8), "src k3": (key_s, 3), "src k8": (key_s, 8), "all k5": (key_1, 5), "src k8 d.9": (key_s, 8, 0.9), "src k8 d.8": (key_s, 8, 0.8), "src+d k8 d.9": (key_sd, 8, 0.9), "oracle": "oracle"}


def main() -> None:
    data = pickle.load(open(sys.argv[1], "rb"))
    for c, reqs in data.items():
        res = {a: [0.0, 0.0] for a in ARMS}
        cls_state = {a: (collections.defaultdict(float), collections.defaultdict(float)) for a in ARMS}
        for ids, log, _ in reqs:
            state = {a: (collections.defaultdict(float), collections.defaultdict(float)) for a in ARMS}
            state["streak cls k3"] = cls_state["streak cls k3"]
            streak = {a: False for a in ARMS}
            pending = {a: [] for a in ARMS}
            for pos, t, probs in log:
                fut = ids[pos:]
                for a, spec in ARMS.items():  # score what the text so far settles
                    if not spec or spec == "oracle": continue
                    pred, real = state[a]; still = []
                    if len(spec) > 2:
                        for kk in pred: pred[kk] *= spec[2]; real[kk] *= spec[2]
                    for at, kk, cn, h in pending[a]:
                        if at < pos: pred[kk] += cn; real[kk] += h
                        else: still.append((at, kk, cn, h))
                    pending[a] = still
                ok = {-1: True}; hits = []
                for n in range(len(t)):
                    h = ok.get(t.parents[n], False) and t.depths[n] <= len(fut) and fut[t.depths[n] - 1] == t.tokens[n]
                    ok[n] = h; hits.append(h)
                cond = []
                for n in range(len(t)):
                    par = t.parents[n]; pp = probs[par] if par >= 0 else 1.0
                    cond.append(min(probs[n] / pp, 1.0) if pp > 0 else 0.0)
                for a, spec in ARMS.items():
                    p = list(probs)
                    if spec == "oracle":
                        p = [1.0 if hits[n] else 0.0 for n in range(len(t))]
                    elif spec:
                        kf, k = spec[:2]; pred, real = state[a]
                        if kf in ("streak", "streakreq"):
                            kf = (lambda t, n, s=streak[a]: (s, t.sources[n], min(t.depths[n], 2)))
                        for n in range(len(t)):
                            par = t.parents[n]; base = p[par] if par >= 0 else 1.0
                            kk = kf(t, n); f = (real[kk] + k) / (pred[kk] + k)
                            p[n] = base * min(1.0, cond[n] * f)
                    plan = allocate_batch([Candidates(t, p, 0, 0.0, False, None, 16)], price, max_width=16)[0]
                    acc = max([t.depths[n] for n in plan.nodes if hits[n]], default=0)
                    res[a][0] += 1 + acc; res[a][1] += plan.cost
                    deepest = max([t.depths[n] for n in plan.nodes], default=0)
                    streak[a] = deepest > 0 and acc == deepest
                    if spec and spec != "oracle":  # learn from every node whose parent was right (settled once the step is verified)
                        for n in range(len(t)):
                            par = t.parents[n]
                            if t.depths[n] > len(fut) or (par >= 0 and not hits[par]): continue
                            pending[a].append((pos + t.depths[n] - 1, kf(t, n), cond[n], hits[n]))
        b = res["base"][0] / res["base"][1]
        print(c, " ".join(f"{a}: {res[a][0]/res[a][1]/b:.3f}" for a in ARMS), f"(base {b:.3f} tok/cost)")


if __name__ == "__main__":
    main()
