# QK^T of the exact attention in float32 (MKL sgemm) instead of oneDNN's bf16 matmul: row invariance and time.
import time, torch
torch.manual_seed(0); torch.set_num_threads(2)
D = 64; H = 9; Hkv = 3; G = H // Hkv
def dots32(q, k):  # q [1, Hkv, G*Q, D] bf16, k [1, Hkv, K, D] bf16 -> fp32 [1, Hkv, G*Q, K]
    return torch.matmul(q.float(), k.float().transpose(-1, -2))
def dots16(q, k):
    return torch.matmul(q, k.contiguous().transpose(-1, -2))
bad = tot = 0
for trial in range(60):
    n = int(torch.randint(20, 1500, ()))
    kk = torch.randn(1, Hkv, 2600, D, dtype=torch.bfloat16)
    q1 = torch.randn(1, Hkv, G, D, dtype=torch.bfloat16)
    ref = None
    for Q, extra in ((1, 0), (2, 0), (4, 0), (8, 5), (16, 30), (3, 70), (12, 200), (5, 1)):
        Kp = -(-(n + extra + Q) // 64) * 64
        q = torch.randn(1, Hkv, G, Q, D, dtype=torch.bfloat16); q[:, :, :, Q // 2] = q1
        out = dots32(q.reshape(1, Hkv, G * Q, D), kk[:, :, :Kp]).view(1, Hkv, G, Q, Kp)[:, :, :, Q // 2, :n]
        if ref is None: ref = out
        else:
            tot += 1
            if not torch.equal(ref, out): bad += 1; print("diff n", n, "Q", Q, "Kp", Kp)
print("fp32 QK^T rows: bad", bad, "of", tot)
def t(fn, reps=300):
    for _ in range(20): fn()
    s = time.perf_counter()
    for _ in range(reps): fn()
    return (time.perf_counter() - s) / reps * 1e6
for n in (320, 700):
    for Q in (4, 8):
        Kp = -(-(n + Q) // 64) * 64
        q = torch.randn(1, Hkv, G * Q, D, dtype=torch.bfloat16); k = torch.randn(1, Hkv, Kp, D, dtype=torch.bfloat16)
        print(f"n {n} Q {Q}: bf16 {t(lambda: dots16(q, k)):.0f} us  fp32 {t(lambda: dots32(q, k)):.0f} us")
