"""../step-overhead/stage_times.py on sampled requests: where a step's time goes outside the model call, per
strategy, over the first REQUESTS of a sampled workload file (128 new tokens, each request with its own
temperature and seed, the calibrator and successors shared across them as a class's are).
Usage: python stage_sampled.py STRATEGIES REQUESTS FILE.jsonl (here: autoregressive,prompt_lookup,lookahead 10 chat_t07.jsonl)"""
import gc, json
import os
__import__("sys").path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "step-overhead"))
import os
import sys
import time

import lookahead.candidates.pool as pool
import lookahead.engine.kvcache as kv
import lookahead.engine.model_runner as mr
import lookahead.engine.step as st
import lookahead.scheduler.request as req
import lookahead.scheduler.scheduler as sch
from timing import acc, load, timed, wrap

if os.environ.get("NOGC"):
    gc.disable()
lm = load()
if os.environ.get("FREEZE"):
    gc.collect()
    gc.freeze()
wrap(sch, "allocate_batch", "allocate")
wrap(req.Request, "propose", "propose")
wrap(pool.SourcePool, "propose", " pool.propose")
wrap(pool.SourcePool, "update", " pool.update")
wrap(req.Request, "absorb", "absorb")
wrap(req.Request, "item", "item")
wrap(sch.Scheduler, "step", "sched.step")
_sb = timed("step_batch", st.StepRunner.step_batch)
IN = [False]  # inside a decoding step (the prefill's forward is not counted)


def sb(*a, **k):
    IN[0] = True
    try:
        return _sb(*a, **k)
    finally:
        IN[0] = False


st.StepRunner.step_batch = sb
_fb = mr.ModelRunner.forward_batch


def fb(*a, **k):  # the forward_batch call, and the part of it outside the model call ("fb.glue")
    t, t0 = time.perf_counter(), a[0].timer.seconds
    out = _fb(*a, **k)
    if IN[0]:
        acc[" forward"] += time.perf_counter() - t
        acc["  fb.glue"] += time.perf_counter() - t - (a[0].timer.seconds - t0)
    return out


mr.ModelRunner.forward_batch = fb
wrap(mr.MaskBuilder, "build", "   masks.build")
wrap(kv.KVCache, "keep", " cache.keep")
wrap(st, "build_query", " build_query")
wrap(st, "largest", " largest")
wrap(st._Choices, "__init__", " choices")
wrap(st.StepRunner, "_align", " _align")
import lookahead
from lookahead.config import SamplingConfig
from lookahead.engine.calibration import Calibrator
from lookahead.candidates.recycling import SuccessorTable
REQS = [json.loads(l) for l in open(sys.argv[3])][: int(sys.argv[2])]
def run(lm, strategy, n, _):
    acc.clear(); steps = 0
    cal, suc = Calibrator(), SuccessorTable()
    for r in REQS:
        g = lookahead.generate(lm, r["messages"], max_new_tokens=128, strategy=strategy, calibrator=cal, successors=suc,
                               prefix_cache=False, sampling=SamplingConfig(temperature=r["temperature"], seed=r["seed"]))
        steps += g.stats.steps
    return steps
for s in sys.argv[1].split(","):
    steps = run(lm, s, 0, 0)
    out = acc["sched.step"] - acc[" forward"] + acc["  fb.glue"]
    print(f"{s} steps {steps}  step {1e3*acc['sched.step']/steps:.2f} ms  outside forward {1e3*out/steps:.3f} ms ({out/acc['sched.step']:.1%})")
    for k, v in sorted(acc.items()):
        print(f"   {k:16s} {1e3 * v / steps:.3f} ms/step")
