"""The exact kernel's bfloat16 scores alone, us a layer (SmolLM2-135M's heads: 9 query heads over 3 kv
heads of 64): the build at OLD_COMMIT (A: 16 lanes, then a tree) against the current one (B: pair sums,
scores_kernel.cpp), calls alternating, over KEYS keys read through a longer cache's strides, the last
10 masked.

    python docs/results/pair-scores/scores.py KEYS [OLD_COMMIT]
"""
import statistics, sys, time

import old_build
import torch

from lookahead.engine import exact_kernel

torch.set_num_threads(2)
keys = int(sys.argv[1])
old = sys.argv[2] if len(sys.argv) > 2 else "6d20276"
arms = {"A": old_build.build(old), "B": exact_kernel.kernel()}
gen = torch.Generator().manual_seed(0)
cache = torch.randn(1, 3, keys + 256, 64, generator=gen).to(torch.bfloat16)
print(f"us a layer, {keys} keys (A: scores at {old}, B: pair sums)")
for rows in (1, 4, 8, 16):
    query = torch.randn(1, rows, 9, 64, generator=gen).to(torch.bfloat16).transpose(1, 2)  # as a pass has it
    mask = torch.zeros(1, rows, keys)
    mask[..., keys - 10:] = float("-inf")
    times = {"A": [], "B": []}
    for rnd in range(401):
        for name in ("A", "B") if rnd % 2 else ("B", "A"):
            t0 = time.perf_counter()
            arms[name].scores(query, cache[:, :, :keys], mask, 0.125)
            if rnd:
                times[name].append(time.perf_counter() - t0)
    a, b = statistics.median(times["A"]) * 1e6, statistics.median(times["B"]) * 1e6
    print(f"{rows:3d} rows: A {a:6.1f}  B {b:6.1f}  B/A {b / a:.3f}", flush=True)
