"""The sampled workload of this folder: requests 0-19 of the public chat and code classes with a temperature
and a random seed each (the server's default temperature is OpenAI's, 1.0).
    python make_workload.py WL OUT   (WL: a `lookahead workloads build` folder)"""
import json
import random
import sys
from pathlib import Path

wl, out = Path(sys.argv[1]), Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
rnd = random.Random(7)
for src, cls, temperature in (("chat", "chat_t07", 0.7), ("code", "code_t07", 0.7), ("chat", "chat_t1", 1.0)):
    with (out / f"{cls}.jsonl").open("w") as f:
        for line in list((wl / f"{src}.jsonl").open())[:20]:
            d = json.loads(line)
            d.update({"class": cls, "id": f"{cls}/{d['id']}", "temperature": temperature, "seed": rnd.randrange(2**53)})
            f.write(json.dumps(d) + "\n")
