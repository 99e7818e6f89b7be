"""Exact passes of 1-16 rows over CONTEXT cached keys, stacked sibling projections (B) against every
layer packed on its own (A): two loads of SmolLM2-135M in one process, arms interleaved, medians; the
logits of every width compared bit for bit.

    python docs/results/stacked-projections/passes.py [CONTEXT] [DTYPE]
"""
import statistics, sys, time

import torch

import lookahead
from lookahead.config import GenerationConfig
from lookahead.engine.kvcache import KVCache
from lookahead.engine.model_runner import Rows
from lookahead.engine.numerics import KEY_ALIGN, width_probe
from lookahead.engine.sampling import TokenChooser
from lookahead.engine.step import StepRunner
from lookahead.models import packing

torch.set_num_threads(2)
ctx = int(sys.argv[1]) if len(sys.argv) > 1 else 600
dtype = sys.argv[2] if len(sys.argv) > 2 else "bfloat16"
B = lookahead.load("smollm2-135m-instruct", dtype=dtype)
stack = packing._stack_siblings
packing._stack_siblings = lambda model: None
A = lookahead.load("smollm2-135m-instruct", dtype=dtype)
packing._stack_siblings = stack
cfg = GenerationConfig()
vocab = B.model.get_output_embeddings().weight.shape[0]
gen = torch.Generator().manual_seed(0)
prompt = torch.randint(0, vocab, (ctx,), generator=gen).tolist()
arms = {}
for name, m in (("A", A), ("B", B)):
    runner = StepRunner(m.model, TokenChooser(cfg.sampling, vocab), width_probe(m.model, cfg.widest_step)).model
    cache = KVCache(KEY_ALIGN)
    runner.prefill(cache, prompt)
    arms[name] = (runner, cache)
widths = (1, 2, 4, 6, 8, 12, 16)
tokens = {k: torch.randint(0, vocab, (k,), generator=gen) for k in widths}
times = {(a, k): [] for a in arms for k in widths}
logits = {}
for rep in range(12):
    for name in ("A", "B") if rep % 2 == 0 else ("B", "A"):
        runner, cache = arms[name]
        for k in widths:
            rows = Rows(tokens[k], torch.arange(ctx, ctx + k), torch.ones(k, k, dtype=torch.bool).tril_(), torch.arange(k))
            for _ in range(4):
                t = time.perf_counter()
                out = runner.forward_batch(cache, [rows])
                times[(name, k)].append(time.perf_counter() - t)
                cache.crop(ctx - cache.get_seq_length())
            logits[(name, k)] = out[0]
print(f"SmolLM2-135M {dtype}, {ctx} cached keys; ms a pass (median of 48), A: packed one by one, B: stacked")
for k in widths:
    a, b = (statistics.median(times[(n, k)]) * 1e3 for n in "AB")
    same = torch.equal(logits[("A", k)], logits[("B", k)])
    print(f"{k:3d} rows  A {a:6.2f}  B {b:6.2f}  B/A {b / a:.3f}  logits identical: {same}")
# the prompt's pass (fused causal kernel): the stacked products are copied apart, a cost at prompt sizes
pre = {"A": [], "B": []}
for rep in range(6):
    for name in ("A", "B") if rep % 2 == 0 else ("B", "A"):
        runner, _ = arms[name]
        cache = KVCache(KEY_ALIGN)
        t = time.perf_counter()
        runner.prefill(cache, prompt)
        pre[name].append(time.perf_counter() - t)
a, b = (statistics.median(pre[n]) * 1e3 for n in "AB")
print(f"prefill of {ctx} tokens  A {a:6.1f}  B {b:6.1f}  B/A {b / a:.3f}")
