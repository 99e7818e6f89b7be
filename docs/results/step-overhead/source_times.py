"""Per-source and per-stage time inside a step's proposing and learning (perf_counter wrappers), per
strategy: where lookahead's extra Python over prompt lookup goes. Usage: source_times.py STRATEGIES REPEATS [PROMPTS]"""
import sys, time, functools, collections
import torch, lookahead
import lookahead.candidates.pool as pool, lookahead.engine.calibration as cal, lookahead.engine.draft as dr
import lookahead.candidates.confidence as conf, lookahead.engine.sampling as sp, lookahead.engine.step as st
import lookahead.scheduler.scheduler as sch
from lookahead.candidates import recycling, suffix, resume, lookahead as jac, context
from lookahead.bench.prompts import PROMPTS
from lookahead.engine.calibration import Calibrator
from lookahead.candidates.recycling import SuccessorTable
torch.set_num_threads(2)
lm = lookahead.load("smollm2-135m-instruct", dtype="bfloat16")
acc = collections.Counter()
def wrap(obj, name, label):
    f = getattr(obj, name)
    @functools.wraps(f)
    def g(*a, **k):
        t = time.perf_counter(); out = f(*a, **k); acc[label] += time.perf_counter() - t; return out
    setattr(obj, name, g)
for mod in (recycling, suffix, resume, jac, context):
    for cname in dir(mod):
        c = getattr(mod, cname)
        if isinstance(c, type) and c.__module__ == mod.__name__ and cname.endswith("Source"):
            for m in ("candidates", "observe", "branch"):
                if m in c.__dict__:
                    wrap(c, m, f"{cname}.{m}")
wrap(conf.ModelConfidence, "observe", "confidence.observe"); wrap(conf.ModelConfidence, "path", "confidence.path")
wrap(cal.GuessTracker, "offer", "tracker.offer"); wrap(cal.GuessTracker, "record", "tracker.record")
wrap(cal.Calibrator, "conditionals_of", "calibrator.conditionals_of"); wrap(cal.Calibrator, "path_probabilities", "calibrator.path_probabilities")
wrap(cal.Calibrator, "observe_siblings", "calibrator.observe_siblings")
wrap(dr.CandidateTree, "add", "tree.add"); wrap(dr.CandidateTree, "cap_siblings", "tree.cap_siblings")
wrap(pool.SourcePool, "_correct_first_tokens", "pool._correct_first_tokens")
wrap(pool.SourcePool, "propose", "pool.propose"); wrap(pool.SourcePool, "update", "pool.update")
wrap(sch, "allocate_batch", "allocate_batch"); wrap(st, "largest", "largest")
for s in sys.argv[1].split(","):
    acc.clear(); steps = 0
    for p in sys.argv[3] if len(sys.argv) > 3 else "abcdef":
        ids = lm.encode(PROMPTS[p]); c, suc = Calibrator(), SuccessorTable()
        for _ in range(int(sys.argv[2])):
            r = lookahead.generate(lm, ids, max_new_tokens=192, strategy=s, calibrator=c, successors=suc, prefix_cache=False)
            steps += r.stats.steps
    print(f"{s} steps {steps}")
    for k, v in sorted(acc.items(), key=lambda kv: -kv[1]): print(f"   {k:34s} {1e3 * v / steps:.3f} ms/step")
