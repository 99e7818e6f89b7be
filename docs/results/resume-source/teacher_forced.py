"""Teacher-forced: tokens per step of the suffix source alone against suffix + resume, every offered guess
verified (an upper bound on what the allocator can take), over greedy answers that gen.py wrote.

    WL=workloads OUTS=answers.jsonl python ../step-anatomy/gen.py code function_calling chat summarization math
    python teacher_forced.py answers.jsonl

Walks each answer step by step: at each step both sources offer their guesses for the text so far, the
step advances by the longest accepted guess + 1 (the model's own token), and the suffix-only figure is
what the suffix source's guesses alone would have settled at the same positions. Also prints, per class
and resume feature, first tokens right / offered, and over all resume guesses the rate of token d right
given tokens 1..d-1 right.
"""

import collections
import json
import sys

from lookahead.candidates.resume import ResumeSource
from lookahead.candidates.suffix import SuffixSource


def settled(guess, truth):
    n = 0
    for g, t in zip(guess, truth):
        if g != t:
            break
        n += 1
    return n


res = collections.defaultdict(collections.Counter)
depth = collections.Counter()
for line in open(sys.argv[1]):
    r = json.loads(line)
    prompt, text, cls = r["prompt"], r["prompt"] + r["out"], r["cls"]
    suffix, resume = SuffixSource(prompt), ResumeSource(prompt)
    t = len(prompt)
    while t < len(text):
        truth = text[t:t + 8]
        a = max([settled(c.tokens, truth) for c in suffix.candidates(text[:t], 8, 8)] or [0])
        b = a
        for c in resume.candidates(text[:t], 8, 4):
            x = settled(c.tokens, truth)
            b = max(b, x)
            res[cls][f"f{c.feature}_n"] += 1
            res[cls][f"f{c.feature}_hit"] += x > 0
            for d in range(1, 6):
                if x >= d - 1:
                    depth[f"reach{d}"] += 1
                    depth[f"hit{d}"] += x >= d
        res[cls]["steps"] += 1
        res[cls]["a"] += a + 1
        res[cls]["b"] += b + 1
        t += b + 1
for cls, c in res.items():
    feats = {f: f"{c[f'f{f}_hit']}/{c[f'f{f}_n']}" for f in range(4) if c[f"f{f}_n"]}
    print(f"{cls:18s} tokens/step suffix {c['a'] / c['steps']:.3f}  suffix + resume {c['b'] / c['steps']:.3f}  "
          f"first tokens right by feature {feats}")
print("resume, P(token d right | 1..d-1 right):",
      {d: round(depth[f"hit{d}"] / max(depth[f"reach{d}"], 1), 2) for d in range(1, 6)},
      "reached", {d: depth[f"reach{d}"] for d in range(1, 6)})
