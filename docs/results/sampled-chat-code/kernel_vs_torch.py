"""Seeded sampling with and without the one-pass choice (engine/topk_kernel.cpp `sampled_choice`): the same
tokens? Autoregressive and lookahead, 128 tokens, 8 chat requests at 0.7, 4 code at 0.7, 8 high-entropy at 1.0.
    python kernel_vs_torch.py SAMPLED_WL WL   (SAMPLED_WL: make_workload.py's folder; WL: lookahead workloads build's)"""
import json, sys, torch, lookahead
from lookahead.config import SamplingConfig
from lookahead.engine import sampling
torch.set_num_threads(2)
lm = lookahead.load("smollm2-135m-instruct")
reqs = [json.loads(l) for l in open(f"{sys.argv[1]}/chat_t07.jsonl")][:8] + [json.loads(l) for l in open(f"{sys.argv[1]}/code_t07.jsonl")][:4] \
     + [json.loads(l) for l in open(f"{sys.argv[2]}/high_entropy.jsonl")][:8]
orig = sampling.TokenChooser._kernel_choice
same = total = 0
for r in reqs:
    prompt = r.get("messages") or r["prompt"]
    cfg = SamplingConfig(temperature=r["temperature"], seed=r["seed"])
    for strategy in ("autoregressive", "lookahead"):
        outs = []
        for use in (True, False):
            sampling.TokenChooser._kernel_choice = orig if use else (lambda self, *a: None)
            outs.append(lookahead.generate(lm, prompt, max_new_tokens=128, sampling=cfg, strategy=strategy, raw="prompt" in r).token_ids)
        same += outs[0] == outs[1]; total += 1
sampling.TokenChooser._kernel_choice = orig
print(f"identical with and without the kernel: {same}/{total}")
