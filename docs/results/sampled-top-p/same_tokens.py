"""The token ids seeded sampling gives, to compare two versions of lookahead: autoregressive and lookahead,
128 tokens, the first N requests of each workload file given (temperature, top_p, top_k and seed from each).
Run under each version (PYTHONPATH=<checkout>), then compare the two JSON files:
    python same_tokens.py OUT.json N FILE.jsonl...
    python same_tokens.py --compare A.json B.json"""
import json
import sys

if sys.argv[1] == "--compare":
    a, b = (json.load(open(p)) for p in sys.argv[2:4])
    assert a.keys() == b.keys(), "different requests"
    same = sum(a[k] == b[k] for k in a)
    print(f"identical token ids: {same}/{len(a)}")
    sys.exit(0 if same == len(a) else 1)

import torch

import lookahead
from lookahead.config import SamplingConfig

torch.set_num_threads(2)
lm = lookahead.load("smollm2-135m-instruct")
out, n = {}, int(sys.argv[2])
for path in sys.argv[3:]:
    for line in list(open(path))[:n]:
        r = json.loads(line)
        cfg = SamplingConfig(temperature=r["temperature"], top_p=r.get("top_p", 1.0), top_k=r.get("top_k", 0), seed=r["seed"])
        prompt = r.get("messages") or r["prompt"]
        for strategy in ("autoregressive", "lookahead"):
            out[f"{r['id']}/{strategy}"] = lookahead.generate(lm, prompt, max_new_tokens=128, sampling=cfg, strategy=strategy,
                                                             raw="prompt" in r).token_ids
json.dump(out, open(sys.argv[1], "w"))
print(f"{len(out)} generations -> {sys.argv[1]} ({lookahead.__file__})")
