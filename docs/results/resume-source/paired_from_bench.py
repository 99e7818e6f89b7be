"""Two lookahead labels of one bench run, paired per request: python paired_from_bench.py RUN_DIR LABEL_A LABEL_B

Per class: how many pairs produced the same tokens, the median of A's decode time over B's (and of the
whole call), tokens and query rows a step of each (summed over the class), each label's median speedup
over autoregressive (whole call), and the tokens B's resume source got accepted.
"""

import collections
import json
import math
import statistics as st
import sys

rows = [json.loads(line) for line in open(sys.argv[1] + "/results.jsonl")]
A, B = sys.argv[2], sys.argv[3]
by = collections.defaultdict(dict)
for r in rows:
    by[(r["class"], r["request_id"], r["repeat"])][r["strategy"]] = r
classes = collections.defaultdict(list)
for (cls, _, _), d in by.items():
    if A in d and B in d:
        classes[cls].append((d[A], d[B], d.get("autoregressive")))


def per_step(rs, key):
    return sum(r[key] for r in rs) / sum(r["steps"] for r in rs)


every = []
for cls, pairs in sorted(classes.items()):
    a, b = [p[0] for p in pairs], [p[1] for p in pairs]
    decode = [x["decode_s"] / y["decode_s"] for x, y, _ in pairs]
    every += decode
    total = st.median(x["total_s"] / y["total_s"] for x, y, _ in pairs)
    same = sum(x["output_sha256"] == y["output_sha256"] for x, y, _ in pairs)
    vs_ar = [(ar["total_s"] / x["total_s"], ar["total_s"] / y["total_s"]) for x, y, ar in pairs if ar]
    resumed = sum((y.get("accepted_by_source") or {}).get("resume", 0) for y in b)
    print(f"{cls:17s} n={len(pairs)} identical={same} B/A decode {st.median(decode):.3f} total {total:.3f} "
          f"tokens/step {per_step(a, 'new_tokens'):.3f} -> {per_step(b, 'new_tokens'):.3f} "
          f"rows/step {per_step(a, 'processed_tokens'):.2f} -> {per_step(b, 'processed_tokens'):.2f} "
          f"vs AR {st.median(v[0] for v in vs_ar):.2f} -> {st.median(v[1] for v in vs_ar):.2f} resume tokens {resumed}")
print(f"all: median {st.median(every):.3f}, geomean {math.exp(st.fmean(math.log(x) for x in every)):.3f}")
