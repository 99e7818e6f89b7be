"""Time to first token with the prefill kernel on and off (LOOKAHEAD_PREFILL_KERNEL), arms interleaved per
prompt, median of repeats: the public workloads' prompts (N a class) and long XSum prompts (~3k, ~6.5k tokens)."""
import json, os, statistics as st, sys, time, torch
torch.set_num_threads(2)
import lookahead
from lookahead.engine import exact_kernel
from lookahead.generation import generate
WL = os.environ.get("WL", "workloads")
n_per_class, repeats = int(sys.argv[1]), int(sys.argv[2])
m = lookahead.load("smollm2-135m-instruct")
prompts = []
for cls in ["chat", "code", "function_calling", "math", "summarization"]:
    rows = [json.loads(l) for l in open(f"{WL}/{cls}.jsonl")][:n_per_class]
    prompts += [(cls, r["messages"]) for r in rows]
rows = [json.loads(l) for l in open(f"{WL}/summarization.jsonl")]
i = 0
for target in (3000, 6500):
    text, n = [], 0
    while n < target:
        text.append(rows[-1 - i]["messages"][-1]["content"]); i += 1
        n = len(m.encode(" ".join(text), raw=True))
    prompts.append((f"long-{target}", [{"role": "user", "content": "\n\n".join(text) + "\n\nSummarize the documents above."}]))
generate(m, prompts[0][1], max_new_tokens=1)
out = {}
for cls, msgs in prompts:
    t = {"0": [], "1": []}
    for _ in range(repeats):
        for arm in ("0", "1"):
            os.environ[exact_kernel.PREFILL_ENV] = arm
            r = generate(m, msgs, max_new_tokens=1, strategy="autoregressive")
            t[arm].append(r.stats.prefill_s)
    line = {"class": cls, "prompt_tokens": r.stats.prompt_tokens, "sdpa_s": st.median(t["0"]), "kernel_s": st.median(t["1"])}
    out.setdefault(cls, []).append(line)
    print(json.dumps(line), flush=True)
print("class | prompts | median prompt tokens | prefill SDPA s | prefill kernel s | median ratio")
for cls, lines in out.items():
    print(cls, len(lines), st.median(x["prompt_tokens"] for x in lines), round(st.median(x["sdpa_s"] for x in lines), 3),
          round(st.median(x["kernel_s"] for x in lines), 3), round(st.median(x["sdpa_s"] / x["kernel_s"] for x in lines), 3))
