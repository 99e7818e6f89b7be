import os
WL = os.environ.get("WL", "workloads")  # lookahead workloads build --out workloads
OUTS = os.environ.get("OUTS", "answers.jsonl")  # gen.py writes the greedy answers here
import json, collections, sys
from lookahead.candidates.suffix import SuffixSource
rows=[json.loads(l) for l in open(OUTS)]
def enc(ts): return b''.join(t.to_bytes(3,'little') for t in ts)
def match_len(ctx, cap=64):
    b=enc(ctx); L=0
    for n in range(1, min(cap, len(ctx)-1)+1):
        suf=b[-3*n:]
        # occurs ending at position <= len-2, i.e. in b[:-3]
        hay=b[:-3]
        pos=hay.find(suf)
        found=False
        while pos!=-1:
            if pos%3==0: found=True; break
            pos=hay.find(suf,pos+1)
        if not found: break
        L=n
    return L
def bucket(L):
    for lim,name in ((0,'0'),(1,'1'),(2,'2'),(4,'3-4'),(8,'5-8'),(15,'9-15'),(31,'16-31')):
        if L<=lim: return name
    return '32+'
stats=collections.defaultdict(lambda: collections.defaultdict(lambda:[0,0]))
bycls=sys.argv[1:] or None
for r in rows:
    if bycls and r['cls'] not in bycls: continue
    src=SuffixSource(r['prompt'], max_match=64)
    out=r['out']
    for i in range(len(out)-1):
        ctx=r['prompt']+out[:i]
        cands=src.candidates(ctx, 16, 1)
        if not cands: continue
        c=cands[0].tokens; truth=out[i:]
        L=match_len(ctx)
        bk=bucket(L)
        for d,t in enumerate(c,1):
            if d>len(truth): break
            stats[bk][d][0]+=1
            if truth[d-1]==t: stats[bk][d][1]+=1
            else: break
for bk in ('1','2','3-4','5-8','9-15','16-31','32+'):
    s=stats.get(bk)
    if not s: continue
    print('%6s'%bk, ' '.join('%d:%.2f(%d)'%(d,s[d][1]/s[d][0],s[d][0]) for d in sorted(s) if s[d][0]>=3))
