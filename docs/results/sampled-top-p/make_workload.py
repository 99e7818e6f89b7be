"""The top-p workload of this folder: requests 0-19 of the public chat and code classes, sampled with a
temperature, a top-p cut and a random seed each, as OpenAI clients often send them.
    python make_workload.py WL OUT   (WL: a `lookahead workloads build` folder)"""
import json
import random
import sys
from pathlib import Path

wl, out = Path(sys.argv[1]), Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
rnd = random.Random(11)
for src, cls, temperature, top_p in (("chat", "chat_t07_p09", 0.7, 0.9), ("chat", "chat_t1_p095", 1.0, 0.95),
                                     ("code", "code_t07_p095", 0.7, 0.95)):
    with (out / f"{cls}.jsonl").open("w") as f:
        for line in list((wl / f"{src}.jsonl").open())[:20]:
            d = json.loads(line)
            d.update({"class": cls, "id": f"{cls}/{d['id']}", "temperature": temperature, "top_p": top_p,
                      "seed": rnd.randrange(2**53)})
            f.write(json.dumps(d) + "\n")
