"""Record the logits rows seeded sampling chooses from: the first 4 chat requests at temperature 0.7 (the
sampled workload's chat_t07.jsonl), 64 tokens each, autoregressive, sampled with the given temperature and
top-p. Writes a [256, 49152] bfloat16 tensor for topp_ab.py.
    python record_rows.py SAMPLED_WL TEMPERATURE TOP_P OUT.pt   (SAMPLED_WL: ../sampled-chat-code/make_workload.py's folder)"""
import json
import sys

import torch

import lookahead
from lookahead import SamplingConfig
from lookahead.engine import sampling

torch.set_num_threads(2)
lm = lookahead.load("smollm2-135m-instruct", dtype="bfloat16")
rows = []
choose = sampling.TokenChooser.choose


def recording(self, logits, positions, top=None):
    rows.extend(logits[r].clone() for r in range(logits.shape[0]))
    return choose(self, logits, positions, top)


sampling.TokenChooser.choose = recording
for line in list(open(f"{sys.argv[1]}/chat_t07.jsonl"))[:4]:
    r = json.loads(line)
    cfg = SamplingConfig(float(sys.argv[2]), top_p=float(sys.argv[3]), seed=r["seed"])
    lookahead.generate(lm, r["messages"], max_new_tokens=64, strategy="autoregressive", sampling=cfg)
torch.save(torch.stack(rows), sys.argv[4])
print(f"{len(rows)} rows -> {sys.argv[4]}")
