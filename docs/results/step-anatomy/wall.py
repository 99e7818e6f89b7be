import torch, time, statistics, sys
import lookahead
from lookahead.config import GenerationConfig
from lookahead.engine.numerics import width_probe
from lookahead.engine.step import StepRunner
from lookahead.engine.sampling import TokenChooser
from lookahead.engine.model_runner import Rows
from lookahead.engine.kvcache import KVCache
from lookahead.engine.numerics import KEY_ALIGN
torch.set_num_threads(2)
m = lookahead.load("smollm2-135m-instruct")
cfg = GenerationConfig()
num = width_probe(m.model, cfg.widest_step)
print(num)
vocab = m.model.get_output_embeddings().weight.shape[0]
sr = StepRunner(m.model, TokenChooser(cfg.sampling, vocab), num)
runner = sr.model
print('floor', runner.floor, 'exact', runner.exact_attention, 'quantum', runner.quantum, 'views', runner.views)
cache = KVCache(KEY_ALIGN)
ctx=int(sys.argv[1]) if len(sys.argv)>1 else 600
runner.prefill(cache, torch.randint(0, vocab, (ctx,)).tolist())
def rows(k):
    return Rows(torch.randint(0, vocab, (k,)), torch.arange(ctx, ctx+k), torch.ones(k,k,dtype=torch.bool).tril_(), torch.arange(k))
res={}
for rep in range(7):
  for k in (1,4,8,12,16):
    r = rows(k)
    ts=[]
    for _ in range(8):
        t=time.perf_counter(); runner.forward_batch(cache, [r]); ts.append(time.perf_counter()-t); cache.crop(ctx - cache.get_seq_length())
    res.setdefault(k,[]).extend(ts[2:])
for k,v in res.items(): print(k, '%.2f ms'%(statistics.median(v)*1000))
from torch.profiler import profile, ProfilerActivity
for k in (4,16):
    r=rows(k)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t=time.perf_counter()
        for _ in range(10):
            runner.forward_batch(cache, [r]); cache.crop(ctx - cache.get_seq_length())
        print(k,'wall in profiler %.2f ms'%((time.perf_counter()-t)*100))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))
