import torch, time, math
import torch.nn.functional as F
torch.set_num_threads(2)
H, KV, D = 9, 3, 64
def t(f,*a,reps=7):
    for _ in range(2): f(*a)
    ts=[]
    for _ in range(reps):
        s=time.perf_counter(); f(*a); ts.append(time.perf_counter()-s)
    return sorted(ts)[len(ts)//2]*1e3
def sdpa(q,k,v): return F.scaled_dot_product_attention(q,k,v,is_causal=True,enable_gqa=True)
def sdpa_rep(q,k,v): return F.scaled_dot_product_attention(q,k.repeat_interleave(3,1),v.repeat_interleave(3,1),is_causal=True)
def sdpa32(q,k,v): return F.scaled_dot_product_attention(q.float(),k.float(),v.float(),is_causal=True,enable_gqa=True).to(q.dtype)
def math_ref(q,k,v):
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        return F.scaled_dot_product_attention(q,k,v,is_causal=True,enable_gqa=True)
for n in [531,1500,3200]:
    q=torch.randn(1,H,n,D,dtype=torch.bfloat16); k=torch.randn(1,KV,n,D,dtype=torch.bfloat16); v=torch.randn(1,KV,n,D,dtype=torch.bfloat16)
    fl=2*2*H*D*n*n/2
    out=[]
    for name,f in [("bf16",sdpa),("bf16rep",sdpa_rep),("fp32",sdpa32),("math",math_ref)]:
        ms=t(f,q,k,v); out.append(f"{name} {ms:.1f}ms {fl/ms/1e6:.0f}GF/s")
    print(n, " | ".join(out))
