"""The prefill kernel (engine/prefill_kernel.cpp) against PyTorch's causal SDPA on random bfloat16 heads:
median of 7 timed calls each, and each one's largest error against a float64 reference.
Usage: python kernel_bench.py [HEAD_DIM HEADS KV_HEADS]  (default: SmolLM2's 64 9 3)."""
import sys, time, torch
import torch.nn.functional as F
from lookahead.engine import exact_kernel
torch.set_num_threads(2)
D, H, KV = (int(a) for a in sys.argv[1:4]) if len(sys.argv) > 3 else (64, 9, 3)
kern = exact_kernel.kernel()
assert kern is not None and kern.prefill_supported(), exact_kernel.status()
def t(f, *a, reps=7):
    for _ in range(2): f(*a)
    ts = []
    for _ in range(reps):
        s = time.perf_counter(); f(*a); ts.append(time.perf_counter() - s)
    return sorted(ts)[len(ts) // 2] * 1e3
def sdpa(q, k, v): return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2).contiguous()
def ours(q, k, v): return kern.causal_prefill(q, k, v, D ** -0.5)
print(f"head size {D}, {H} query heads over {KV} kv heads, bfloat16, 2 threads")
for n in [100, 531, 1500, 3200, 6500]:
    g = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(1, h, n, D, generator=g).bfloat16() for h in (H, KV, KV))
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True, enable_gqa=True).transpose(1, 2)
    flops = 4 * H * D * n * n / 2
    ts, to = t(sdpa, q, k, v), t(ours, q, k, v)
    print(f"n={n}: SDPA {ts:.2f} ms ({flops/ts/1e6:.0f} GFLOP/s), kernel {to:.2f} ms ({flops/to/1e6:.0f} GFLOP/s), "
          f"{ts/to:.2f}x; largest error vs float64: SDPA {(sdpa(q, k, v).double() - ref).abs().max():.4f}, "
          f"kernel {(ours(q, k, v).double() - ref).abs().max():.4f}", flush=True)
