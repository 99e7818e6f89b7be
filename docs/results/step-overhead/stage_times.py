"""Where a decoding step's time goes outside the model call: wall time of each stage per step, by
wrapping the engine's functions with perf_counter (no profiler: cProfile and line tracing inflate
Python-heavy stages 2-3x). Usage: python stage_times.py STRATEGIES REPEATS [PROMPTS]
(e.g. `autoregressive,lookahead 2 abcdef`: prompts a-f, 192 new tokens, each repeated with the
learned state carried over). "outside forward" = the scheduler's step minus the model call itself
(the glue inside ModelRunner.forward_batch counts as outside); NOGC=1 / FREEZE=1 try the garbage
collector off / frozen (no effect measured)."""
import sys, time, functools, collections, statistics
import torch, lookahead
import lookahead.scheduler.scheduler as sch, lookahead.scheduler.request as req
import lookahead.engine.step as st, lookahead.engine.model_runner as mr, lookahead.engine.kvcache as kv
import lookahead.candidates.pool as pool, lookahead.engine.sampling as sp
from lookahead.bench.prompts import PROMPTS
from lookahead.engine.calibration import Calibrator
from lookahead.candidates.recycling import SuccessorTable
torch.set_num_threads(2)
import gc, os
if os.environ.get("NOGC"): gc.disable()
if os.environ.get("FREEZE"): gc.freeze()
lm = lookahead.load("smollm2-135m-instruct", dtype="bfloat16")
if os.environ.get("FREEZE"): gc.collect(); gc.freeze()
acc = collections.Counter()
def timed(name, f):
    @functools.wraps(f)
    def g(*a, **k):
        t = time.perf_counter(); out = f(*a, **k); acc[name] += time.perf_counter() - t; return out
    return g
sch.allocate_batch = timed("allocate", sch.allocate_batch)
req.Request.propose = timed("propose", req.Request.propose)
pool.SourcePool.propose = timed(" pool.propose", pool.SourcePool.propose)
pool.SourcePool.update = timed(" pool.update", pool.SourcePool.update)
req.Request.absorb = timed("absorb", req.Request.absorb)
req.Request.item = timed("item", req.Request.item)
sch.Scheduler.step = timed("sched.step", sch.Scheduler.step)
_sb = timed("step_batch", st.StepRunner.step_batch)
IN = [False]
def sb(*a, **k):
    IN[0] = True
    try: return _sb(*a, **k)
    finally: IN[0] = False
st.StepRunner.step_batch = sb
_fb = mr.ModelRunner.forward_batch
def fb(*a, **k):
    t = time.perf_counter(); t0 = a[0].timer.seconds; out = _fb(*a, **k)
    if IN[0]: acc[" forward"] += time.perf_counter() - t; acc["  fb.glue"] += time.perf_counter() - t - (a[0].timer.seconds - t0)
    return out
mr.ModelRunner.forward_batch = fb
mr.MaskBuilder.build = timed("   masks.build", mr.MaskBuilder.build)
kv.KVCache.keep = timed(" cache.keep", kv.KVCache.keep)
st.build_query = timed(" build_query", st.build_query)
st.largest = timed(" largest", st.largest)
st._Choices.__init__ = timed(" choices", st._Choices.__init__)
st.StepRunner._align = timed(" _align", st.StepRunner._align)
for s in sys.argv[1].split(","):
    acc.clear(); steps = 0
    for p in sys.argv[3] if len(sys.argv) > 3 else "abcdef":
        ids = lm.encode(PROMPTS[p]); cal, suc = Calibrator(), SuccessorTable()
        for _ in range(int(sys.argv[2])):
            r = lookahead.generate(lm, ids, max_new_tokens=192, strategy=s, calibrator=cal, successors=suc, prefix_cache=False)
            steps += r.stats.steps
    out = acc["sched.step"] - acc[" forward"] + acc["  fb.glue"]
    print(f"{s} steps {steps}  step {1e3*acc['sched.step']/steps:.2f} ms  outside forward {1e3*out/steps:.3f} ms ({out/acc['sched.step']:.1%})")
    for k, v in sorted(acc.items()): print(f"   {k:16s} {1e3 * v / steps:.3f} ms/step")
