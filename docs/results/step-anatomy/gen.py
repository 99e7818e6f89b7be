import os
WL = os.environ.get("WL", "workloads")  # lookahead workloads build --out workloads
OUTS = os.environ.get("OUTS", "answers.jsonl")  # gen.py writes the greedy answers here
import json, sys, torch
import lookahead
from lookahead.generation import generate
torch.set_num_threads(2)
m = lookahead.load("smollm2-135m-instruct")
out = open(OUTS,'w')
for cls in sys.argv[1:]:
    for r in [json.loads(l) for l in open(f"{WL}/{cls}.jsonl")][:20]:
        ids = m.encode(r["messages"])
        g = generate(m, r["messages"], max_new_tokens=128, strategy="lookahead")
        out.write(json.dumps({"cls": cls, "id": r.get("id"), "prompt": ids, "out": g.token_ids})+"\n"); out.flush()
