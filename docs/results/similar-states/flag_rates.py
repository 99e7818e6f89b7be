"""Teacher-forced: how often the suffix source's guesses are right when they follow the occurrence in the
nearest state and when not, per calibration feature, over greedy answers (../step-anatomy/gen.py).

    python flag_rates.py answers.jsonl [more.jsonl ...]   (flag_rates.txt: the 160 answers' output)

At every position of each answer the suffix source (states off) offers its guesses for the text so
far; the nearest of the longest match's occurrences is found from the model's final hidden states (one
bfloat16 pass over the whole text), and a guess is "near" when its tokens agree with that occurrence's
continuation as far as both go. Prints per class and feature (3 * length bucket + share bucket): first
tokens right / offered, near and far.
"""
import collections, json, sys
import numpy as np, torch
import lookahead
torch.set_num_threads(2)
lm = lookahead.load("smollm2-135m-instruct", dtype="bfloat16")
from lookahead.candidates.suffix import SuffixSource
agg = collections.defaultdict(collections.Counter)
for fn in sys.argv[1:]:
  for line in open(fn):
    r = json.loads(line)
    prompt, text, cls = r["prompt"], r["prompt"] + r["out"], r["cls"]
    with torch.no_grad():
        H = torch.nn.functional.normalize(lm.model(torch.tensor([text]), output_hidden_states=True).hidden_states[-1][0].float(), dim=-1).numpy()
    s = SuffixSource(prompt)
    for t in range(len(prompt), len(text)):
        cands = s.candidates(text[:t], 8, 4)
        L, found = s.occurrences()
        if not cands or not found: continue
        nearest = max(found, key=lambda p: float(H[t - 2] @ H[p - 1]) if p >= 1 else -2)
        ncont = tuple(text[nearest + 1: nearest + 9])
        truth = text[t]
        for rank, c in enumerate(cands):
            has = ncont[:len(c.tokens)] == c.tokens[:len(ncont)] and ncont[:1] == c.tokens[:1]
            key = f"f{c.feature:02d}_{'near' if has else 'far'}"
            agg[cls][key + "_n"] += 1
            agg[cls][key + "_hit"] += c.tokens[0] == truth
for cls, c in agg.items():
    print(cls, " ".join(f"{k[:-2]} {c[k[:-2]+'_hit']}/{c[k]}={c[k[:-2]+'_hit']/max(c[k],1):.2f}" for k in sorted(c) if k.endswith("_n")))
