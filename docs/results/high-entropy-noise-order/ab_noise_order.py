"""In-process A/B of the sampled row order in candidates/recycling.py: lookahead with it and without it
(rows kept in rank order), the two arms interleaved per request, each with its own calibrator and table.
Usage: python ab_noise_order.py <class or workload .jsonl> <first request> <count> [temperature]"""
import json, sys, torch, statistics, collections, time
import lookahead
from lookahead.generation import generate
from lookahead.config import SamplingConfig
from lookahead.engine.calibration import Calibrator
from lookahead.candidates.recycling import SuccessorTable, RecyclingSource
torch.set_num_threads(2)
m = lookahead.load("smollm2-135m-instruct")
real = RecyclingSource._drawn_first
start = int(sys.argv[2]); n = int(sys.argv[3]); temp = float(sys.argv[4]) if len(sys.argv) > 4 else None
for cls in sys.argv[1].split(","):
    reqs = [json.loads(l) for l in open(cls if cls.endswith(".jsonl") else f"/tmp/wl/{cls}.jsonl")][start:start + n]
    state = {a: (Calibrator(), SuccessorTable()) for a in ("base", "noise")}
    ratios = []; tps = collections.defaultdict(list); src = collections.defaultdict(collections.Counter); same = 0
    for r in reqs:
        raw = "messages" not in r
        msgs = r["prompt"] if raw else r["messages"]
        cfg = SamplingConfig(temperature=temp or r.get("temperature", 1.0), top_p=r.get("top_p", 1.0), seed=r.get("seed", 7))
        out = {}
        for a in ("base", "noise"):
            RecyclingSource._drawn_first = real if a == "noise" else (lambda self, row, token, position: row)
            cal, succ = state[a]
            g = generate(m, msgs, raw=raw, max_new_tokens=128, strategy="lookahead", sampling=cfg, calibrator=cal, successors=succ)
            out[a] = g; tps[a].append(g.stats.tokens_per_step); src[a].update(g.stats.accepted_by_source)
        same += out["base"].token_ids == out["noise"].token_ids
        ratios.append(out["base"].stats.decode_s / out["noise"].stats.decode_s)
    print(f"{cls} T={temp}: paired noise/base speed median {statistics.median(ratios):.3f} geo {statistics.geometric_mean(ratios):.3f}; tok/step base {statistics.mean(tps['base']):.3f} noise {statistics.mean(tps['noise']):.3f}; identical {same}/{len(reqs)}; base {dict(src['base'])} noise {dict(src['noise'])}", flush=True)
