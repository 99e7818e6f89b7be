# Per-layer attention time: exact_attention vs SDPA at keys padded to 64 / 512, Q rows, bf16.
import time, torch, torch.nn.functional as F
from lookahead.engine import attention as A
torch.set_num_threads(2); D = 64; H = 9; Hkv = 3
def t(fn, reps=300):
    for _ in range(20): fn()
    s = time.perf_counter()
    for _ in range(reps): fn()
    return (time.perf_counter() - s) / reps * 1e6
for n in (200, 320, 450, 700, 1000):
    for Q in (1, 4, 8):
        row = []
        for pad in (64, 512):
            Kp = -(-(n + Q) // pad) * pad
            q = torch.randn(1, H, Q, D, dtype=torch.bfloat16); k = torch.randn(1, Hkv, Kp, D, dtype=torch.bfloat16); v = torch.randn_like(k)
            mask = torch.full((1, 1, Q, Kp), float("-inf")); mask[..., : n + 1] = 0
            m16 = mask.to(torch.bfloat16)
            row.append(t(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=m16, scale=0.125, enable_gqa=True)))
            if pad == 64:
                tok = A._active.set(True)
                row.append(t(lambda: A.exact_attention(None, q, k, v, mask, scaling=0.125)))
                A._active.reset(tok)
        print(f"n {n} Q {Q}: sdpa64 {row[0]:.0f} us  exact {row[1]:.0f} us  sdpa512 {row[2]:.0f} us")
