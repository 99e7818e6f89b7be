"""A/B, interleaved per request in one process: a step's top-k read by torch.topk (A) or by
lookahead.engine.sampling.largest (B). Each arm keeps its own calibrator and successor table."""
import json, sys, statistics, torch
import lookahead
import lookahead.engine.step as ST
from lookahead.engine.sampling import largest
from lookahead.engine.calibration import Calibrator
from lookahead.candidates.recycling import SuccessorTable
from lookahead.generation import generate
torch.set_num_threads(2)
model, wl, classes, n = sys.argv[1], sys.argv[2], sys.argv[3].split(","), int(sys.argv[4])
m = lookahead.load(model)
arms = {"topk": lambda x, k: torch.topk(x, k, dim=-1), "largest": largest}
state = {(c, a): (Calibrator(), SuccessorTable()) for c in classes for a in arms}
rows = []
generate(m, "Hello", max_new_tokens=8)
for c in classes:
    reqs = [json.loads(l) for l in open(f"{wl}/{c}.jsonl")][:n]
    for r in reqs:
        out = {}
        for a, fn in arms.items():
            ST.largest = fn
            cal, succ = state[(c, a)]
            g = generate(m, r["messages"], max_new_tokens=128, strategy="lookahead", calibrator=cal, successors=succ)
            s = g.stats
            out[a] = (g.token_ids, s.decode_s / s.new_tokens * 1000, s.overhead_s / s.steps * 1000, s.tokens_per_step)
        same = out["topk"][0] == out["largest"][0]
        rows.append((c, same, out["topk"][1] / out["largest"][1], out["topk"][2], out["largest"][2], out["topk"][3], out["largest"][3]))
        print(c, r.get("id"), "identical" if same else "DIFFERENT", "speed %.3f overhead ms/step %.2f -> %.2f tok/step %.2f -> %.2f" % rows[-1][2:], flush=True)
for c in classes:
    rs = [x for x in rows if x[0] == c]
    print(f"{c}: n={len(rs)} identical {sum(x[1] for x in rs)}/{len(rs)} paired speed median {statistics.median(x[2] for x in rs):.3f} "
          f"overhead ms/step {statistics.median(x[3] for x in rs):.2f} -> {statistics.median(x[4] for x in rs):.2f} "
          f"tok/step {statistics.median(x[5] for x in rs):.2f} -> {statistics.median(x[6] for x in rs):.2f}")
