"""Seeded top-k/top-p choices before and after, interleaved call by call on recorded SmolLM2 logits
(record_rows.py), asserting the same tokens; medians per call of 1 and 4 rows. BEFORE.py: an earlier
engine/sampling.py (here a372031's, with `, None` added to its sampled_choice call: the kernel's floors
argument, which it did not pass). By default the noise is generated beforehand (the choice alone); with
--fresh each call decides fresh positions, forgotten after it as decoding forgets them, so each side pays
for the noise or draws its rule needs, and the noise rows each side computed are counted
(../sampled-draws/choice-ab.txt, BEFORE.py there 591c7fa's sampling.py).
    python topp_ab.py ROWS.pt BEFORE.py [--fresh]"""
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
FRESH = "--fresh" in sys.argv[3:]
RULES = [(0.7, 1.0, 0), (0.7, 0.95, 0), (0.7, 0.9, 0), (1.0, 0.95, 0), (1.0, 1.0, 50), (0.7, 0.9, 50)]
if FRESH:
    RULES = [(0.7, 1.0, 0), (1.0, 1.0, 0), (0.7, 0.9, 0), (0.7, 0.95, 0), (1.0, 0.95, 0), (1.0, 1.0, 50), (0.7, 0.9, 50)]
for T, p, k in RULES:
    cfg = SamplingConfig(T, top_p=p, top_k=k, seed=1)
    a, b = before.TokenChooser(cfg, 49152), sampling.TokenChooser(cfg, 49152)
    noise_rows = [0, 0]  # rows whose noise row was computed: after, before
    if FRESH:
        a.choose(X[:1], [10**6]), b.choose(X[:1], [10**6])  # first-use checks out of the timing
        for chooser, at in ((b, 0), (a, 1)):
            real = chooser.gumbel
            chooser.gumbel = lambda q, real=real, at=at: (noise_rows.__setitem__(at, noise_rows[at] + 1), real(q))[1]
    else:
        for pos in range(X.shape[0]):
            a.gumbel(pos), b.gumbel(pos)
    for R in (1, 4):
        ta, tb = [], []
        for i in range(0, X.shape[0] - R + 1, R):
            rows, pos = X[i:i + R], [R * 1000 + j if FRESH else j for j in range(i, i + R)]
            t0 = time.perf_counter()
            ca = a.choose(rows, pos)
            t1 = time.perf_counter()
            cb = b.choose(rows, pos)
            t2 = time.perf_counter()
            assert ca == cb, (cfg, i)
            if FRESH:
                a.forget_before(pos[-1] + 1), b.forget_before(pos[-1] + 1)
            ta.append(t1 - t0)
            tb.append(t2 - t1)
        ma, mb = statistics.median(ta) * 1e6, statistics.median(tb) * 1e6
        counted = f", noise rows computed {noise_rows[0]}/{noise_rows[1]}" if FRESH else ""
        print(f"T={T} top_p={p} top_k={k} rows={R}: before {ma:.0f} us, after {mb:.0f} us (median; mean "
              f"{statistics.mean(ta) * 1e6:.0f} -> {statistics.mean(tb) * 1e6:.0f}), same tokens on {len(ta)} calls"
              f"{counted}", flush=True)
