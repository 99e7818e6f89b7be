# Is SDPA (CPU flash, bf16) row-invariant when keys are padded to a multiple of PAD?
# Same row (same visible keys at the same indices), passes of Q = 1..16 rows, different key counts,
# visible keys contiguous or with masked gaps (aligned trees).
import sys, torch, torch.nn.functional as F
torch.manual_seed(0); torch.set_num_threads(2)
PAD = int(sys.argv[1]); D = 64; H = 9; Hkv = 3
def run(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype), scale=0.125, enable_gqa=True)
bad = tot = 0
worst = {}
for trial in range(60):
    n = int(torch.randint(20, 1500, ()))
    gaps = trial % 2 == 1
    kk = torch.randn(1, Hkv, 2600, D, dtype=torch.bfloat16); vv = torch.randn(1, Hkv, 2600, D, dtype=torch.bfloat16)
    q1 = torch.randn(1, H, 1, D, dtype=torch.bfloat16)
    vis = torch.zeros(2600, dtype=torch.bool); vis[:n] = True
    if gaps:  # a few masked keys between the visible ones past the cached prefix
        vis[n - 7 : n - 2] = False; vis[n + 3] = True; vis[n + 9] = True
    span = int(torch.nonzero(vis).max()) + 1
    ref = None
    for Q, extra in ((1, 0), (2, 0), (4, 0), (8, 5), (16, 30), (3, 70), (1, 64), (12, 200), (6, 513), (5, 1)):
        Kp = -(-(span + extra + Q) // PAD) * PAD
        q = torch.randn(1, H, Q, D, dtype=torch.bfloat16); q[:, :, Q // 2] = q1[:, :, 0]
        mask = torch.full((1, 1, Q, Kp), float("-inf"))
        mask[0, 0, Q // 2, :Kp] = torch.where(vis[:Kp], 0.0, float("-inf"))
        for r in range(Q):
            if r != Q // 2: mask[0, 0, r, : n] = 0
        out = run(q, kk[:, :, :Kp], vv[:, :, :Kp], mask)[:, :, Q // 2]
        if ref is None: ref = out
        else:
            tot += 1
            if not torch.equal(ref, out):
                bad += 1; print("diff n", n, "gaps", gaps, "Q", Q, "Kp", Kp, (ref.float() - out.float()).abs().max().item())
print("PAD", PAD, "bad", bad, "of", tot)
