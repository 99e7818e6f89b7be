import torch, time, statistics
from lookahead.engine import exact_kernel
torch.set_num_threads(2)
kern = exact_kernel.kernel()
def t(fn, n=50):
    for _ in range(5): fn()
    ts=[]
    for _ in range(7):
        s=time.perf_counter()
        for _ in range(n): fn()
        ts.append((time.perf_counter()-s)/n*1e6)
    return statistics.median(ts)
for K,vis in ((768,600),(1280,1100)):
    for q in (1,4,8,16):
        query=torch.randn(1,9,q,64).bfloat16(); key=torch.randn(1,3,K,64).bfloat16(); value=torch.randn(1,3,K,64).bfloat16()
        mask=torch.zeros(1,q,K); mask[...,vis:]=float('-inf')
        sc = kern.scores(query, key, mask, 0.125)
        probs = torch.softmax(sc.view(1,3,3,q,K), -1).view(1,3,3*q,K)
        a=t(lambda: kern.scores(query,key,mask,0.125)); b=t(lambda: torch.softmax(sc.view(1,3,3,q,K), -1)); c=t(lambda: kern.weighted(probs, value))
        print(K,q,'scores %.0f softmax %.0f weighted %.0f us'%(a,b,c))
