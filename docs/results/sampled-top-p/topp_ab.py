"""Seeded top-k/top-p choices before and after, interleaved call by call on recorded SmolLM2 logits
(record_rows.py), asserting the same tokens; medians per call of 1 and 4 rows, the noise generated
beforehand. BEFORE.py: an earlier engine/sampling.py (here a372031's, with `, None` added to its
sampled_choice call: the kernel's floors argument, which it did not pass).
    python topp_ab.py ROWS.pt BEFORE.py"""
import importlib.util
import statistics
import sys
import time

import torch

from lookahead.config import SamplingConfig
from lookahead.engine import exact_kernel, sampling

exact_kernel.kernel()
torch.set_num_threads(2)
spec = importlib.util.spec_from_file_location("sampling_before", sys.argv[2])
before = importlib.util.module_from_spec(spec)
spec.loader.exec_module(before)
X = torch.load(sys.argv[1])
for T, p, k in [(0.7, 1.0, 0), (0.7, 0.95, 0), (0.7, 0.9, 0), (1.0, 0.95, 0), (1.0, 1.0, 50), (0.7, 0.9, 50)]:
    cfg = SamplingConfig(T, top_p=p, top_k=k, seed=1)
    a, b = before.TokenChooser(cfg, 49152), sampling.TokenChooser(cfg, 49152)
    for pos in range(X.shape[0]):
        a.gumbel(pos), b.gumbel(pos)
    for R in (1, 4):
        ta, tb = [], []
        for i in range(0, X.shape[0] - R + 1, R):
            rows, pos = X[i:i + R], list(range(i, i + R))
            t0 = time.perf_counter()
            ca = a.choose(rows, pos)
            t1 = time.perf_counter()
            cb = b.choose(rows, pos)
            t2 = time.perf_counter()
            assert ca == cb, (cfg, i)
            ta.append(t1 - t0)
            tb.append(t2 - t1)
        ma, mb = statistics.median(ta) * 1e6, statistics.median(tb) * 1e6
        print(f"T={T} top_p={p} top_k={k} rows={R}: before {ma:.0f} us, after {mb:.0f} us (median; mean "
              f"{statistics.mean(ta) * 1e6:.0f} -> {statistics.mean(tb) * 1e6:.0f}), same tokens on {len(ta)} calls")
