import os
WL = os.environ.get("WL", "workloads")  # lookahead workloads build --out workloads
OUTS = os.environ.get("OUTS", "answers.jsonl")  # gen.py writes the greedy answers here
import json, collections, sys, torch
import lookahead
from lookahead.candidates.suffix import SuffixSource
torch.set_num_threads(2)
m = lookahead.load("smollm2-135m-instruct")
rows=[json.loads(l) for l in open(OUTS)]
def bucketL(L): return 0 if L<=1 else 1 if L<=2 else 2 if L<=4 else 3 if L<=8 else 4
def bconf(p): return 0 if p<0.5 else 1 if p<0.8 else 2 if p<0.95 else 3
stats=collections.defaultdict(lambda:[0,0,0.0])
for r in rows:
    ids=r['prompt']+r['out']; P=len(r['prompt'])
    with torch.no_grad():
        lg=m.model(input_ids=torch.tensor([ids])).logits[0].float()
    pr=torch.softmax(lg,-1)
    # conf of token ids[j] predicted at row j-1
    conf=pr[torch.arange(len(ids)-1), torch.tensor(ids[1:])].tolist()  # conf[j-1] = P(ids[j])
    src=SuffixSource(r['prompt'])
    out=r['out']
    for i in range(1,len(out)-1):
        ctx=ids[:P+i]  # root = out[i-1]
        cands=src.candidates(ctx,8,1)
        if not cands: continue
        c=cands[0]; truth=out[i:]
        d=0
        for t,g in zip(truth,c.tokens):
            if t!=g: break
            d+=1
        root_conf=conf[P+i-2]  # P(out[i-1]) at its row
        key=(r['cls'], c.feature//3, bconf(root_conf))
        s=stats[key]; s[0]+=1; s[1]+=d>0; s[2]+=d
for cls in ('code','function_calling','chat','math','summarization'):
    print('==',cls)
    for Lb in range(5):
        print('  Lb%d'%Lb, '  '.join('c%d: n%4d hit %.2f len %.2f'%(cb, stats[(cls,Lb,cb)][0], stats[(cls,Lb,cb)][1]/max(1,stats[(cls,Lb,cb)][0]), stats[(cls,Lb,cb)][2]/max(1,stats[(cls,Lb,cb)][0])) for cb in range(4)))
