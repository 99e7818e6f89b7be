"""Sibling projections stacked (B) against packed one by one (A): the same requests, both arms in one
process, interleaved per request (the order alternating), outputs compared token for token.

    python docs/results/stacked-projections/ab.py WORKLOAD FROM PER_CLASS [MAX_NEW] [DTYPE]
"""
import json, math, statistics, sys, time

import torch

import lookahead
from lookahead.generation import generate
from lookahead.models import packing

torch.set_num_threads(2)
wl, start, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
max_new = int(sys.argv[4]) if len(sys.argv) > 4 else 96
dtype = sys.argv[5] if len(sys.argv) > 5 else "bfloat16"
B = lookahead.load("smollm2-135m-instruct", dtype=dtype)
stack = packing._stack_siblings
packing._stack_siblings = lambda model: None  # arm A: every layer packed on its own
A = lookahead.load("smollm2-135m-instruct", dtype=dtype)
packing._stack_siblings = stack
count = lambda m: sum(isinstance(x, packing.PackedProjection) for x in m.model.modules())
print(f"{dtype}: stacked layers A {count(A)}, B {count(B)}", flush=True)
reqs = []
for c in ("chat", "code", "function_calling", "math", "summarization"):
    reqs += [json.loads(l) for l in open(f"{wl}/{c}.jsonl")][start:start + per]
ratios: dict[str, list[float]] = {}
for i, r in enumerate(reqs):
    for strategy in ("autoregressive", "lookahead"):
        arms = (("A", A), ("B", B)) if i % 2 == 0 else (("B", B), ("A", A))
        out = {}
        for name, m in arms:
            t = time.perf_counter()
            g = generate(m, r["messages"], max_new_tokens=max_new, strategy=strategy)
            out[name] = (time.perf_counter() - t, g.token_ids)
        assert out["A"][1] == out["B"][1], f"request {i} {strategy}: the arms disagree"
        ratios.setdefault(strategy, []).append(out["B"][0] / out["A"][0])
    print(i, r.get("id", ""), {s: round(v[-1], 3) for s, v in ratios.items()}, flush=True)
for s, v in ratios.items():
    geo = math.exp(sum(map(math.log, v)) / len(v))
    print(json.dumps({"dtype": dtype, "strategy": s, "n": len(v), "median_time_B_over_A": round(statistics.median(v), 4),
                      "geomean": round(geo, 4), "identical": True}))
