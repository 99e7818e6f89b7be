"""Long prompts: XSum articles from the public workload concatenated to ~N tokens, then a summary
request. Strategies interleaved per prompt, median of repeats, outputs compared token for token."""
import json, os, sys, statistics as st, torch
torch.set_num_threads(2)
import lookahead
from lookahead.generation import generate
m = lookahead.load("smollm2-135m-instruct")
rows = [json.loads(l) for l in open(os.environ.get('WL', 'workloads') + '/summarization.jsonl')]
target, count, repeats = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
strategies = ["autoregressive", "lookahead", "prompt_lookup"]
i = 0; out = []
for _ in range(count):
    text, n = [], 0
    while n < target:
        text.append(rows[-1 - i]['messages'][-1]['content']); i += 1
        n = len(m.encode(" ".join(text), raw=True))
    msgs = [{"role": "user", "content": "\n\n".join(text) + "\n\nSummarize the documents above in a few sentences."}]
    res = {s: [] for s in strategies}
    for _ in range(repeats):
        for s in strategies:
            r = generate(m, msgs, max_new_tokens=128, strategy=s)
            res[s].append(r)
    ar = st.median(r.stats.total_s for r in res["autoregressive"])
    line = {"prompt_tokens": res["autoregressive"][0].stats.prompt_tokens, "new_tokens": len(res["autoregressive"][0].token_ids),
            "prefill_s": round(st.median(r.stats.prefill_s for r in res["autoregressive"]), 3), "ar_s": round(ar, 3)}
    for s in strategies[1:]:
        t = st.median(r.stats.total_s for r in res[s])
        line[s] = {"speedup": round(ar / t, 3), "tokens_per_step": round(res[s][0].stats.tokens_per_step, 2),
                   "rows_per_step": round(res[s][0].stats.processed_tokens / res[s][0].stats.steps, 2),
                   "identical": all(r.token_ids == res["autoregressive"][0].token_ids for r in res[s])}
    print(json.dumps(line), flush=True); out.append(line)
