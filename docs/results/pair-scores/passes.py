"""Wall time of exact bfloat16 passes of k query rows through the engine's own model runner over CONTEXT
cached keys, with the exact kernel's scores summed over dimension pairs (B: scores_kernel.cpp) and as
the extension at OLD_COMMIT sums them (A: 16 lanes, then a tree; built here from its git blobs). Only
`scores` differs: arm A takes everything else (linears, softmax, value sums) from the current build, so
the two arms run the same linear-kernel binary. Arms alternate call by call (order flipped every
round); medians of ROUNDS calls each.

    python docs/results/pair-scores/passes.py CONTEXT [ROWS,ROWS,..] [ROUNDS] [OLD_COMMIT]
"""
import statistics, sys, time

import old_build
import torch

import lookahead
from lookahead.config import GenerationConfig
from lookahead.engine import exact_kernel
from lookahead.engine.kvcache import KVCache
from lookahead.engine.model_runner import Rows
from lookahead.engine.numerics import KEY_ALIGN, width_probe
from lookahead.engine.sampling import TokenChooser
from lookahead.engine.step import StepRunner

torch.set_num_threads(2)
context = int(sys.argv[1])
widths = [int(x) for x in sys.argv[2].split(",")] if len(sys.argv) > 2 else [1, 4, 8, 12]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 100
old = sys.argv[4] if len(sys.argv) > 4 else "6d20276"
old_module = old_build.build(old)
M = lookahead.load("smollm2-135m-instruct", dtype="bfloat16")
new = exact_kernel.kernel()


class OldScores:  # the old build's scores, everything else from the new one
    scores = staticmethod(old_module.scores)

    def __getattr__(self, name):
        return getattr(new, name)


arms = {"A": OldScores(), "B": new}
cfg = GenerationConfig()
vocab = M.model.get_output_embeddings().weight.shape[0]
runner = StepRunner(M.model, TokenChooser(cfg.sampling, vocab), width_probe(M.model, cfg.widest_step)).model
gen = torch.Generator().manual_seed(0)
cache = KVCache(KEY_ALIGN if runner.floor else 1)
runner.prefill(cache, torch.randint(0, vocab, (context,), generator=gen).tolist())
print(f"{context} cached keys: ms a pass, median of {rounds} calls an arm (A: scores at {old}, B: pair sums)")
for k in widths:
    rows = Rows(torch.randint(0, vocab, (k,), generator=gen), torch.arange(context, context + k),
                torch.ones(k, k, dtype=torch.bool).tril_(), torch.arange(k))
    times = {"A": [], "B": []}
    for rnd in range(rounds + 1):  # the first round warms up
        for name in ("A", "B") if rnd % 2 else ("B", "A"):
            exact_kernel._built["module"] = arms[name]
            t0 = time.perf_counter()
            runner.forward_batch(cache, [rows])
            if rnd:
                times[name].append(time.perf_counter() - t0)
            cache.crop(context - cache.get_seq_length())
    exact_kernel._built["module"] = new
    a, b = statistics.median(times["A"]), statistics.median(times["B"])
    print(f"{k:3d} rows: A {a * 1e3:6.2f}  B {b * 1e3:6.2f}  B/A {b / a:.3f}", flush=True)
