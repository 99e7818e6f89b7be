import os, torch
torch.set_num_threads(2)
import lookahead
from lookahead.engine import exact_kernel
from lookahead.bench.prompts import PROMPTS
m = lookahead.load("smollm2-135m-instruct")
for name, p in PROMPTS.items():
    outs = {}
    for arm in ("0", "1"):
        os.environ[exact_kernel.PREFILL_ENV] = arm
        outs[arm] = lookahead.generate(m, [{"role": "user", "content": p}], max_new_tokens=192, strategy="autoregressive").token_ids
    same = next((i for i, (a, b) in enumerate(zip(outs["0"], outs["1"])) if a != b), min(len(outs["0"]), len(outs["1"])))
    print(name, "identical" if outs["0"] == outs["1"] else f"diverge at token {same}", len(outs["0"]), len(outs["1"]))
    if name == "a" and outs["0"] != outs["1"]:
        print("SDPA  :", repr(m.tokenizer.decode(outs["0"][same - 5: same + 60])))
        print("kernel:", repr(m.tokenizer.decode(outs["1"][same - 5: same + 60])))
