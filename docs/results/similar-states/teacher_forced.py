"""Teacher-forced: which earlier occurrence of the longest suffix match to copy from, over greedy answers
(docs/results/step-anatomy/gen.py writes them: one JSON line per answer, "cls", "prompt", "out" ids).

    python teacher_forced.py answers.jsonl [more.jsonl ...]

At each step position t of an answer (T = prompt + answer, the root T[t-1]) the earlier occurrences
of the longest suffix of T[:t] (ends p <= t-2, up to 32 tokens) are collected, and their continuations
T[p+1 : p+9] ranked in five ways; a step then advances by the tokens its guess(es) settle + 1:
  freq    the most frequent first token among the continuations, then the newest occurrence (what the
          suffix source's first path does)
  cos     the occurrence whose state before it, s(p-1), is nearest (cosine) to s(t-2), the state of the
          row that chose the root; s = the final norm's output, from one pass over T (bfloat16)
  ctxW    the most tokens equal in the W positions before the match (W = 8, 32, 128), then the newest
  freq2 / cos2   the better of the first two distinct continuations by freq / by cos
  oracle  the best continuation there is
Prints tokens per step per class and mode.
"""

import collections
import json
import sys

import numpy as np
import torch

import lookahead

torch.set_num_threads(2)
lm = lookahead.load("smollm2-135m-instruct", dtype="bfloat16")
D = 8
MODES = ("freq", "cos", "ctx8", "ctx32", "ctx128", "freq2", "cos2", "oracle")


def settled(guess, truth):
    n = 0
    for g, t in zip(guess, truth):
        if g != t:
            break
        n += 1
    return n


def states(ids):
    with torch.no_grad():
        out = lm.model(torch.tensor([ids]), output_hidden_states=True)
    h = out.hidden_states[-1][0].float()
    return torch.nn.functional.normalize(h, dim=-1).numpy()


def occurrences(text, t):
    """(match length, ends p) of the longest earlier match of text[:t]'s suffix."""
    T = np.array(text[: t - 1])
    ps = np.nonzero(T == text[t - 1])[0]
    if not len(ps):
        return 0, []
    lengths = []
    for p in ps:
        n = 1
        while n < 32 and p - n >= 0 and text[p - n] == text[t - 1 - n]:
            n += 1
        lengths.append(n)
    lengths = np.array(lengths)
    return int(lengths.max()), [int(p) for p in ps[lengths == lengths.max()]]


def pick(mode, text, t, H, L, ends, truth):
    conts = {p: text[p + 1 : p + 1 + D] for p in ends}
    first = collections.Counter(tuple(c[:1]) for c in conts.values())
    by_freq = sorted(conts, key=lambda p: (first[tuple(conts[p][:1])], p), reverse=True)
    by_cos = sorted(conts, key=lambda p: float(H[t - 2] @ H[p - 1]) if p >= 1 else -2.0, reverse=True)

    def distinct(order):
        out = []
        for p in order:
            if all(conts[p] != conts[q] for q in out):
                out.append(p)
        return out

    if mode == "freq":
        return [conts[by_freq[0]]]
    if mode == "cos":
        return [conts[by_cos[0]]]
    if mode.startswith("ctx"):
        w = int(mode[3:])
        agree = {p: sum(1 for j in range(L + 1, L + 1 + w) if p - j >= 0 and text[p - j] == text[t - 1 - j]) for p in conts}
        return [conts[max(conts, key=lambda p: (agree[p], p))]]
    if mode == "freq2":
        return [conts[p] for p in distinct(by_freq)[:2]]
    if mode == "cos2":
        return [conts[p] for p in distinct(by_cos)[:2]]
    return list(conts.values())


agg = collections.defaultdict(collections.Counter)
for fn in sys.argv[1:]:
    for line in open(fn):
        r = json.loads(line)
        prompt, text, cls = r["prompt"], r["prompt"] + r["out"], r["cls"]
        H = states(text)
        for mode in MODES:
            t, steps = len(prompt), 0
            while t < len(text):
                truth = text[t : t + D]
                L, ends = occurrences(text, t)
                x = max((settled(g, truth) for g in pick(mode, text, t, H, L, ends, truth)), default=0) if ends else 0
                t += x + 1
                steps += 1
            agg[cls][mode] += steps
        agg[cls]["tokens"] += len(text) - len(prompt)
print("class              " + " ".join(f"{m:>7s}" for m in MODES))
for cls, c in agg.items():
    print(f"{cls:18s} " + " ".join(f"{c['tokens'] / c[m]:7.3f}" for m in MODES))
