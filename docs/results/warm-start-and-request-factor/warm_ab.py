"""Warm start A/B: learn on disjoint workload requests, then a-f and per-class requests, cold vs warm arms
interleaved per request, each arm with its own calibrator + successors carried across its requests.
    python warm_ab.py WORKLOAD_DIR TRAIN_FROM TRAIN_N TEST_FROM TEST_N   (run here: 24 24 0 20)"""
import copy, json, statistics, sys, tempfile, time
from pathlib import Path
import torch
import lookahead
from lookahead.bench.prompts import PROMPTS
from lookahead.engine.calibration import Calibrator
from lookahead.candidates.recycling import SuccessorTable
from lookahead.learned import write_learned

torch.set_num_threads(2)
wl = Path(sys.argv[1]); train_from, train_n = int(sys.argv[2]), int(sys.argv[3])
test_from, test_n = int(sys.argv[4]), int(sys.argv[5])
lm = lookahead.load("smollm2-135m-instruct")
CL = ("chat", "code", "function_calling", "math", "summarization")
work = {c: [json.loads(l)["messages"] for l in (wl / f"{c}.jsonl").open()] for c in CL}
cal, succ = Calibrator(), SuccessorTable()
t0 = time.time()
for i in range(train_from, train_from + train_n):
    for c in CL:
        lookahead.generate(lm, work[c][i], max_new_tokens=128, calibrator=cal, successors=succ)
print(f"learned {train_n}x{len(CL)} in {time.time()-t0:.0f}s", flush=True)
p = Path(tempfile.mkdtemp()) / "learned.json"; write_learned(lm, p, {"lookahead/greedy": {"calibrator": cal, "successors": succ}})
print("file bytes", p.stat().st_size, flush=True)

def arms():
    return {"cold": (Calibrator(), SuccessorTable()), "warm": (copy.deepcopy(cal), copy.deepcopy(succ))}

def run(state, prompt, n):
    r = lookahead.generate(lm, prompt, max_new_tokens=n, calibrator=state[0], successors=state[1])
    return r, r.stats.decode_s / r.stats.new_tokens

out = {}
# a-f: three repeats, each arm fresh per repeat, a..f in order
for rep in range(3):
    st = arms()
    for k in "abcdef":
        res = {}
        for arm in (("cold", "warm") if rep % 2 else ("warm", "cold")):
            res[arm] = run(st[arm], PROMPTS[k], 192)
        assert res["cold"][0].token_ids == res["warm"][0].token_ids, k
        out.setdefault(k, []).append((res["cold"][0].stats.tokens_per_step, res["warm"][0].stats.tokens_per_step, res["cold"][1] / res["warm"][1]))
for k, v in out.items():
    print(k, "tps cold %.2f warm %.2f speed %.3f" % (statistics.mean(x[0] for x in v), statistics.mean(x[1] for x in v), statistics.median(x[2] for x in v)), flush=True)
print("a-f geomean speed warm/cold", statistics.geometric_mean(statistics.median(x[2] for x in v) for v in out.values()), flush=True)
# per class: each arm carries its state over the class's requests (as the bench does)
for c in CL:
    st = arms(); rows = []
    for n, i in enumerate(range(test_from, test_from + test_n)):
        res = {}
        for arm in (("cold", "warm") if n % 2 else ("warm", "cold")):
            res[arm] = run(st[arm], work[c][i], 128)
        assert res["cold"][0].token_ids == res["warm"][0].token_ids, (c, i)
        rows.append((res["cold"][0].stats.tokens_per_step, res["warm"][0].stats.tokens_per_step, res["cold"][1] / res["warm"][1]))
    print(c, "tps cold %.2f warm %.2f speed %.3f (first 5: %.3f)" % (statistics.mean(x[0] for x in rows), statistics.mean(x[1] for x in rows), statistics.median(x[2] for x in rows), statistics.median(x[2] for x in rows[:5])), flush=True)
