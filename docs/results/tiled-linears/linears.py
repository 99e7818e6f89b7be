"""The linear layers alone: 30 layers of SmolLM2-135M's shapes (q/k/v stacked, o, gate/up stacked, down), random
bfloat16 weights, oneDNN packed against tiled, arms interleaved, median of 7; the row counts as arguments.

    python docs/results/tiled-linears/linears.py 1 4 8 16 64 600
"""
import time, torch, statistics, sys
from lookahead.models import packing
torch.set_num_threads(2)
torch.manual_seed(0)
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
Ws = [[torch.randn(n, k, dtype=torch.bfloat16) * 0.05 for n, k in shapes] for _ in range(30)]
P = [[torch.ops.mkldnn._reorder_linear_weight(w, 8) for w in L] for L in Ws]
G = [[packing._pack(w) for w in L] for L in Ws]
for M in [int(a) for a in sys.argv[1:]]:
    xs = [torch.randn(M, k, dtype=torch.bfloat16) for n, k in shapes]
    ta, tb = [], []
    for rep in range(7):
        for arm, L, tl in (("a", P, ta), ("b", G, tb)):
            t = time.perf_counter()
            for lay in L:
                for w, x in zip(lay, xs): packing._packed_matmul(x, w, None)
            tl.append(time.perf_counter() - t)
    a, b = statistics.median(ta) * 1e3, statistics.median(tb) * 1e3
    print(f"M={M:3d} onednn {a:6.2f} ms  tiled {b:6.2f} ms  ratio {b/a:.3f}", flush=True)
