"""Where a decoding step's time goes outside the model call: wall time of each stage per step, by
wrapping the engine's functions with perf_counter (no profiler: cProfile and line tracing inflate
Python-heavy stages 2-3x). Usage: python stage_times.py STRATEGIES REPEATS [PROMPTS | FILE.jsonl]
(e.g. `autoregressive,lookahead 2 abcdef`: prompts a-f, 192 new tokens, each repeated with the
learned state carried over). "outside forward" = the scheduler's step minus the model call itself
(the glue inside ModelRunner.forward_batch counts as outside); NOGC=1 / FREEZE=1 try the garbage
collector off / frozen (no effect measured)."""
import gc
import os
import sys
import time

import lookahead.candidates.pool as pool
import lookahead.engine.kvcache as kv
import lookahead.engine.model_runner as mr
import lookahead.engine.step as st
import lookahead.scheduler.request as req
import lookahead.scheduler.scheduler as sch
from timing import acc, load, run, timed, wrap

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
for s in sys.argv[1].split(","):
    steps = run(lm, s, int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "abcdef")
    out = acc["sched.step"] - acc[" forward"] + acc["  fb.glue"]
    print(f"{s} steps {steps}  step {1e3*acc['sched.step']/steps:.2f} ms  outside forward {1e3*out/steps:.3f} ms ({out/acc['sched.step']:.1%})")
    for k, v in sorted(acc.items()):
        print(f"   {k:16s} {1e3 * v / steps:.3f} ms/step")
