"""The exact attention's kernels at SmolLM2-135M's head shape (9 query heads over 3 kv heads, head size
64), KEYS cached keys (8 of them masked padding), 1-16 query rows: the C++ softmax (fixed-point sum)
against torch's float32 softmax on the same scores, interleaved, medians of 300 calls; the scores and
value sums for scale.

    python docs/results/gap-free-trees/kernels.py [KEYS]
"""
import statistics, sys, time

import torch

from lookahead.engine import exact_kernel

torch.set_num_threads(2)
kern = exact_kernel.kernel()
keys = int(sys.argv[1]) if len(sys.argv) > 1 else 608
gen = torch.Generator().manual_seed(0)
key = torch.randn(1, 3, keys, 64, generator=gen).bfloat16()
value = torch.randn(1, 3, keys, 64, generator=gen).bfloat16()


def median_us(f, n=300):
    for _ in range(20):
        f()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e6


print(f"us a layer, {keys} keys: scores | softmax torch, kernel (each less a copy of its input) | value sums")
for q in (1, 2, 4, 8, 16):
    query = torch.randn(1, 9, q, 64, generator=gen).bfloat16()
    mask = torch.zeros(1, q, keys)
    mask[..., keys - 8:] = float("-inf")
    scores = kern.scores(query, key, mask, 0.125)
    probs = kern.softmax_(scores.clone())
    work = scores.clone()
    times = {"copy": [], "torch": [], "kernel": []}
    for rep in range(3):
        times["copy"].append(median_us(lambda: work.copy_(scores)))
        times["torch"].append(median_us(lambda: torch.softmax(work.copy_(scores), -1)))
        times["kernel"].append(median_us(lambda: kern.softmax_(work.copy_(scores))))
    m = {k: statistics.median(v) for k, v in times.items()}
    s = median_us(lambda: kern.scores(query, key, mask, 0.125))
    w = median_us(lambda: kern.weighted(probs, value))
    print(f"{q:2d} rows: scores {s:6.1f} | softmax torch {m['torch'] - m['copy']:5.1f}, kernel {m['kernel'] - m['copy']:5.1f} "
          f"| value sums {w:6.1f}")
