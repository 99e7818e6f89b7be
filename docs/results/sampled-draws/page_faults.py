"""Minor page faults per decoding step, sampled chat at temperature 0.7 (the first 4 requests of
../sampled-chat-code/make_workload.py's chat_t07.jsonl, 128 tokens), autoregressive and lookahead.
    python page_faults.py SAMPLED_WL"""
import resource, time, json, sys, torch
import lookahead
from lookahead import SamplingConfig
torch.set_num_threads(2)
lm = lookahead.load("smollm2-135m-instruct", dtype="bfloat16")
reqs=[json.loads(l) for l in open(f"{sys.argv[1]}/chat_t07.jsonl")][:4]
for strat in ("autoregressive","lookahead"):
    for r in reqs[:1]:
        lookahead.generate(lm, r["messages"], max_new_tokens=16, strategy=strat, sampling=SamplingConfig(0.7, seed=r["seed"]))
    f0=resource.getrusage(resource.RUSAGE_SELF).ru_minflt; t=time.perf_counter(); steps=0
    for r in reqs:
        out=lookahead.generate(lm, r["messages"], max_new_tokens=128, strategy=strat, sampling=SamplingConfig(0.7, seed=r["seed"]))
        steps+=out.stats.steps
    f1=resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    print(strat, "steps", steps, "minor faults/step", round((f1-f0)/steps,1), "s", round(time.perf_counter()-t,2))
