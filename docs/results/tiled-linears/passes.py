"""Exact passes of 1-64 rows over CONTEXT cached keys, linears on lookahead's tiled kernel (B) against
oneDNN's packed kernel (A, LOOKAHEAD_LINEAR_KERNEL=0 while it loads): two loads of SmolLM2-135M in one
process, each with its own width probe, arms interleaved, medians; then the prompt's pass.

    python docs/results/tiled-linears/passes.py [CONTEXT]
"""
import os, statistics, sys, time

import torch

import lookahead
from lookahead.config import GenerationConfig
from lookahead.engine.exact_kernel import LINEAR_ENV
from lookahead.engine.kvcache import KVCache
from lookahead.engine.model_runner import Rows
from lookahead.engine.numerics import KEY_ALIGN, width_probe
from lookahead.engine.sampling import TokenChooser
from lookahead.engine.step import StepRunner
from lookahead.models.packing import TiledWeight

torch.set_num_threads(2)
ctx = int(sys.argv[1]) if len(sys.argv) > 1 else 600
B = lookahead.load("smollm2-135m-instruct", dtype="bfloat16", probe=False)
os.environ[LINEAR_ENV] = "0"
A = lookahead.load("smollm2-135m-instruct", dtype="bfloat16", probe=False)
del os.environ[LINEAR_ENV]
tiled = lambda m: sum(isinstance(getattr(x, "packed", None), TiledWeight) or  # noqa: E731
                      isinstance(getattr(getattr(x, "stacked", None), "packed", None), TiledWeight) for x in m.model.modules())
cfg = GenerationConfig()
vocab = B.model.get_output_embeddings().weight.shape[0]
gen = torch.Generator().manual_seed(0)
prompt = torch.randint(0, vocab, (ctx,), generator=gen).tolist()
arms = {}
for name, m in (("A", A), ("B", B)):
    probe = width_probe(m.model, cfg.widest_step)
    print(f"{name}: {tiled(m)} layers tiled, width floor {probe.floor}, ceiling {probe.ceiling}", flush=True)
    runner = StepRunner(m.model, TokenChooser(cfg.sampling, vocab), probe).model
    cache = KVCache(KEY_ALIGN)
    runner.prefill(cache, prompt)
    arms[name] = (runner, cache)
widths = (1, 2, 3, 4, 6, 8, 12, 16, 32, 64)
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
            logits[(name, k)] = out[0].float()
print(f"SmolLM2-135M bfloat16, {ctx} cached keys; ms a pass (median of 48), A: oneDNN linears, B: tiled")
for k in widths:
    a, b = (statistics.median(times[(n, k)]) * 1e3 for n in "AB")
    la, lb = logits[("A", k)], logits[("B", k)]
    agree = (la.argmax(-1) == lb.argmax(-1)).float().mean().item()
    print(f"{k:3d} rows  A {a:6.2f}  B {b:6.2f}  B/A {b / a:.3f}  logits max |B-A| {(lb - la).abs().max().item():.3f}, "
          f"argmax agrees on {agree:.0%} of rows")
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
