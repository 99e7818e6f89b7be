"""Paired per-request ratios of total_s for the prefix-cache run: python paired.py results.jsonl.gz"""
import gzip, json, sys, statistics as S, collections, math
rows = [json.loads(l) for l in (gzip.open if sys.argv[1].endswith(".gz") else open)(sys.argv[1], "rt")]
by = collections.defaultdict(dict)
for r in rows:
    by[(r["class"], r["request_id"], r["repeat"])][r["strategy"]] = r
def gm(x): return math.exp(sum(map(math.log, x)) / len(x))
classes = sorted({k[0] for k in by})
pairs = [("lookahead", "autoregressive"), ("lookahead/whole", "autoregressive/whole"), ("prompt_lookup", "autoregressive"),
         ("lookahead", "prompt_lookup"), ("autoregressive/whole", "autoregressive"), ("lookahead/whole", "lookahead")]
print("class".ljust(18), " ".join(f"{a[:9]}|{b[:9]}".rjust(20) for a, b in pairs), " cached  pf-share(AR) pf-share(ARw) decode LA/AR")
mism = 0
for c in classes:
    reqs = [v for k, v in by.items() if k[0] == c]
    out = []
    for a, b in pairs:
        rs = [q[b]["total_s"] / q[a]["total_s"] for q in reqs if a in q and b in q]
        out.append(f"{S.median(rs):.3f} (gm {gm(rs):.3f})".rjust(20))
    cached = S.median(q["lookahead"]["cached_tokens"] for q in reqs)
    pf = S.median(q["autoregressive"]["prefill_s"] / q["autoregressive"]["total_s"] for q in reqs)
    pfw = S.median(q["autoregressive/whole"]["prefill_s"] / q["autoregressive/whole"]["total_s"] for q in reqs)
    dec = S.median(q["autoregressive"]["decode_s"] / q["lookahead"]["decode_s"] for q in reqs)
    mism += sum(1 for q in reqs for s in q.values() if s.get("identical") is False)
    print(c.ljust(18), " ".join(out), f"{cached:7.0f}  {pf:.3f}  {pfw:.3f}  {dec:.3f}")
print("mismatches", mism, "rows", len(rows))
