"""Trees laid out gap-free on the C++ attention kernel (B: engine/attention.py key_layout, GAP_FREE, now
that the kernel takes the softmax's sum in fixed point) against the same trees under the matmul path's
rules (A: each node's key at an offset congruent to its depth mod 16, in its 256-key block, a pair
partner right after its parent; what the engine did before). One model, one numerics: per request
autoregressive decoding once and lookahead in both arms (alternating order), each arm with its own
calibrator and recycled successors learning across its requests. Both arms must equal autoregressive
decoding token for token, so the comparison is on identical text.

    python docs/results/gap-free-trees/ab.py WORKLOAD FROM PER_CLASS [MAX_NEW]
"""
import json, math, statistics, sys, time

import torch

import lookahead
import lookahead.engine.step as step
from lookahead.candidates.recycling import SuccessorTable
from lookahead.config import SamplingConfig
from lookahead.engine.attention import KeyLayout
from lookahead.engine.calibration import Calibrator
from lookahead.generation import generate
from lookahead.workloads.format import parse_workload

torch.set_num_threads(2)
wl, start, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
max_new = int(sys.argv[4]) if len(sys.argv) > 4 else 128
M = lookahead.load("smollm2-135m-instruct", dtype="bfloat16")
layout = step.model_key_layout
arms = {"A": lambda model: KeyLayout(), "B": layout}
learned = {name: (Calibrator(), SuccessorTable()) for name in arms}
reqs = []
for c in ("chat", "code", "function_calling", "high_entropy", "math", "summarization"):
    reqs += [(c, r) for r in parse_workload(f"{wl}/{c}.jsonl")[start:start + per]]
rows = []
for i, (c, r) in enumerate(reqs):
    kw = dict(max_new_tokens=max_new, raw=r.prompt is not None,
              sampling=SamplingConfig(r.temperature, r.top_k, r.top_p, r.effective_seed))
    prompt = r.prompt if r.prompt is not None else r.chat()
    t = time.perf_counter()
    ar = generate(M, prompt, strategy="autoregressive", **kw)
    row = {"class": c, "ar_s": time.perf_counter() - t, "tokens": len(ar.token_ids)}
    for name in ("A", "B") if i % 2 == 0 else ("B", "A"):
        step.model_key_layout = arms[name]
        cal, succ = learned[name]
        t = time.perf_counter()
        g = generate(M, prompt, strategy="lookahead", calibrator=cal, successors=succ, **kw)
        row[f"{name}_s"] = time.perf_counter() - t
        assert g.token_ids == ar.token_ids, f"request {i} ({c}), arm {name}: differs from autoregressive decoding"
        row[f"{name}_steps"] = g.stats.steps
        row[f"{name}_rows"] = g.stats.processed_tokens / g.stats.steps
    step.model_key_layout = layout
    rows.append(row)
    print(i, c, {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
geo = lambda v: math.exp(sum(map(math.log, v)) / len(v))  # noqa: E731
print(f"{'class':18s} {'n':>3s} {'tok/step A':>10s} {'tok/step B':>10s} {'rows A':>7s} {'rows B':>7s} {'B vs A':>7s} {'A vs AR':>8s} {'B vs AR':>8s}")
summary = {"requests": len(rows), "max_new_tokens": max_new}
for c in [*dict.fromkeys(r["class"] for r in rows), "all"]:
    sel = [r for r in rows if c in ("all", r["class"])]
    tps = {n: sum(r["tokens"] for r in sel) / sum(r[f"{n}_steps"] for r in sel) for n in "AB"}
    width = {n: statistics.median(r[f"{n}_rows"] for r in sel) for n in "AB"}
    ba = statistics.median(r["A_s"] / r["B_s"] for r in sel)
    va = {n: statistics.median(r["ar_s"] / r[f"{n}_s"] for r in sel) for n in "AB"}
    print(f"{c:18s} {len(sel):3d} {tps['A']:10.2f} {tps['B']:10.2f} {width['A']:7.1f} {width['B']:7.1f} {ba:7.3f} {va['A']:8.3f} {va['B']:8.3f}")
    summary[c] = {"tokens_per_step_A": round(tps["A"], 3), "tokens_per_step_B": round(tps["B"], 3),
                  "B_speedup_over_A_median": round(ba, 4), "A_over_ar_median": round(va["A"], 3),
                  "B_over_ar_median": round(va["B"], 3)}
summary["B_speedup_over_A_geomean"] = round(geo([r["A_s"] / r["B_s"] for r in rows]), 4)
print(json.dumps(summary))
