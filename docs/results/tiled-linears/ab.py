"""Whole requests with linears on lookahead's tiled kernel (B) against oneDNN's packed kernel (A,
LOOKAHEAD_LINEAR_KERNEL=0 while it loads): both arms in one process, each with its own width probe and
cost curve, per request all four runs (autoregressive and lookahead, both arms) in alternating order.
Within an arm lookahead must equal autoregressive decoding token for token; across arms the numbers
differ in the last bits, so the text may too: compared as seconds per generated token.

    python docs/results/tiled-linears/ab.py WORKLOAD FROM PER_CLASS [MAX_NEW]
"""
import json, math, os, statistics, sys, time
from dataclasses import replace

import torch

import lookahead
from lookahead.engine.exact_kernel import LINEAR_ENV
from lookahead.engine.numerics import width_probe
from lookahead.generation import generate

torch.set_num_threads(2)
wl, start, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
max_new = int(sys.argv[4]) if len(sys.argv) > 4 else 96
B = lookahead.load("smollm2-135m-instruct", dtype="bfloat16", probe=False)
os.environ[LINEAR_ENV] = "0"
A = lookahead.load("smollm2-135m-instruct", dtype="bfloat16", probe=False)
del os.environ[LINEAR_ENV]
A = replace(A, name=A.name + " (oneDNN linears)")  # its own cached cost curve (timing_key)
for m in (A, B):
    width_probe(m.model, 64)  # in memory, per model: the disk cache's key cannot tell the arms apart here
reqs = []
for c in ("chat", "code", "function_calling", "math", "summarization"):
    reqs += [(c, json.loads(l)) for l in open(f"{wl}/{c}.jsonl")][start:start + per]
per_token: dict[tuple[str, str], list[float]] = {}
speedup: dict[str, list[float]] = {}
same_text = 0
for i, (c, r) in enumerate(reqs):
    arms = (("A", A), ("B", B)) if i % 2 == 0 else (("B", B), ("A", A))
    out = {}
    for strategy in ("autoregressive", "lookahead") if i % 4 < 2 else ("lookahead", "autoregressive"):
        for name, m in arms:
            t = time.perf_counter()
            g = generate(m, r["messages"], max_new_tokens=max_new, strategy=strategy)
            out[(name, strategy)] = (time.perf_counter() - t, g.token_ids)
    for name in "AB":
        ar, la = out[(name, "autoregressive")], out[(name, "lookahead")]
        assert ar[1] == la[1], f"request {i} arm {name}: lookahead differs from autoregressive decoding"
        speedup.setdefault(name, []).append(ar[0] / la[0])
        for s in ("autoregressive", "lookahead"):
            per_token.setdefault((name, s), []).append(out[(name, s)][0] / len(out[(name, s)][1]))
    same_text += out[("A", "lookahead")][1] == out[("B", "lookahead")][1]
    print(i, c, {k: round(v[-1] * 1e3, 1) for k, v in per_token.items()}, flush=True)
geo = lambda v: math.exp(sum(map(math.log, v)) / len(v))  # noqa: E731
summary = {"requests": len(reqs), "max_new_tokens": max_new, "same_tokens_across_arms": same_text}
for s in ("autoregressive", "lookahead"):
    ratios = [b / a for a, b in zip(per_token[("A", s)], per_token[("B", s)])]
    summary[f"{s}_ms_per_token_A"] = round(statistics.median(per_token[("A", s)]) * 1e3, 2)
    summary[f"{s}_ms_per_token_B"] = round(statistics.median(per_token[("B", s)]) * 1e3, 2)
    summary[f"{s}_B_over_A_median"] = round(statistics.median(ratios), 4)
    summary[f"{s}_B_over_A_geomean"] = round(geo(ratios), 4)
for name in "AB":
    summary[f"lookahead_speedup_{name}_median"] = round(statistics.median(speedup[name]), 3)
    summary[f"lookahead_speedup_{name}_geomean"] = round(geo(speedup[name]), 3)
print(json.dumps(summary))
