"""Reads reliability.py's pickle. Every offered node is scored against the answer (a node is right when
its whole path equals the tokens that followed its root). Prints:
  1. reliability of the verified nodes by predicted path probability, as the allocator saw it (after the
     realization factor) and before it (the calibrator's own);
  2. per class: summed probabilities of the verified nodes against the right ones, and the factor's median;
  3. headroom: right tokens in the verified part against the whole offered tree, and why the rest were left
     (a verified right chain cut short, or a right first token not verified).
Usage: python analyse.py steps.pkl"""
import collections
import pickle
import statistics
import sys

runs = pickle.load(open(sys.argv[1], "rb"))
EDGES = [0, .02, .05, .1, .2, .3, .5, .7, .9, 1.01]


def bucket(p):
    return next(i for i in range(len(EDGES) - 1) if p < EDGES[i + 1])


def right(run, st):
    """[node] -> its whole path equals the answer's tokens after the step's root."""
    k, out, n = st["pos"] - run["plen"], run["out"], len(st["tokens"])
    ok = [False] * n
    for i in range(n):
        par, d = st["parents"][i], st["depths"][i]
        ok[i] = (par < 0 or ok[par]) and k + d - 1 < len(out) and out[k + d - 1] == st["tokens"][i]
    return ok


classes = sorted({r["cls"] for r in runs})
for key, title in (("probs", "after the realization factor (what the allocator saw)"), ("raw", "the calibrator's own")):
    print(f"1. verified nodes, predicted path probability {title}: [bucket) nodes, mean p, share right")
    table = collections.defaultdict(lambda: [0, 0.0, 0])
    for run in runs:
        for st in run["steps"]:
            ok = right(run, st)
            for i in st.get("plan", []):
                cell = table[(run["cls"], bucket(st[key][i]))]
                cell[0] += 1
                cell[1] += st[key][i]
                cell[2] += ok[i]
    for c in classes:
        print(f"  {c:17s}", " ".join(f"[{EDGES[b]:.2f}) n{table[(c, b)][0]} p{table[(c, b)][1] / table[(c, b)][0]:.3f} "
                                     f"right{table[(c, b)][2] / table[(c, b)][0]:.3f}"
                                     for b in range(len(EDGES) - 1) if table[(c, b)][0]))
print("2. verified nodes: summed probability against right nodes, per class")
for c in classes:
    raw = scaled = hits = 0.0
    factors = []
    for run in (r for r in runs if r["cls"] == c):
        for st in run["steps"]:
            ok = right(run, st)
            plan = st.get("plan", [])
            raw += sum(st["raw"][i] for i in plan)
            scaled += sum(st["probs"][i] for i in plan)
            hits += sum(ok[i] for i in plan)
            if st["raw"] and st["raw"][0] > 0:
                factors.append(st["probs"][0] / st["raw"][0])
    print(f"  {c:17s} calibrator {raw / hits:.2f}x the right nodes, after the factor {scaled / hits:.2f}x; "
          f"factor median {statistics.median(factors):.3f}")
print("3. headroom: right tokens a step in the verified part / in the whole offered tree")
for c in classes:
    a = collections.Counter()
    for run in (r for r in runs if r["cls"] == c):
        for st in run["steps"]:
            ok, plan, n = right(run, st), set(st.get("plan", [])), len(st["tokens"])
            whole = max([st["depths"][i] for i in range(n) if ok[i]], default=0)
            got = max([st["depths"][i] for i in plan if ok[i]], default=0)
            a["steps"] += 1
            a["whole"] += whole
            a["got"] += got
            a["rows"] += st.get("w", 1)
            if whole > got:
                kind = "cut" if got else "first"
                a[kind] += 1
                a[kind + " tokens"] += whole - got
    s = a["steps"]
    print(f"  {c:17s} {a['got'] / s:.2f} / {a['whole'] / s:.2f} at {a['rows'] / s:.2f} rows; right chain cut short on "
          f"{a['cut'] / s:.1%} of steps (+{a['cut tokens'] / max(1, a['cut']):.1f} tokens), right first token "
          f"not verified on {a['first'] / s:.1%} (+{a['first tokens'] / max(1, a['first']):.1f})")
