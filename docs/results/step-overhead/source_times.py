"""Per-source and per-stage time inside a step's proposing and learning (perf_counter wrappers), per
strategy: where lookahead's extra Python over prompt lookup goes. Usage: source_times.py STRATEGIES REPEATS [PROMPTS | FILE.jsonl]
(FILE.jsonl: its first REPEATS requests, as timing.run_file decodes them; the sampling rule's noise and choice
and recycling's `_drawn_first` are timed too)"""
import sys

import lookahead.candidates.confidence as conf
import lookahead.candidates.pool as pool
import lookahead.engine.calibration as cal
import lookahead.engine.draft as dr
import lookahead.engine.step as st
import lookahead.scheduler.scheduler as sch
from lookahead.candidates import context, lookahead as jac, recycling, resume, suffix
import lookahead.engine.sampling as smp
from timing import acc, load, run, wrap

lm = load()
for mod in (recycling, suffix, resume, jac, context):  # every source's candidates, observe and branch
    for cname in dir(mod):
        c = getattr(mod, cname)
        if isinstance(c, type) and c.__module__ == mod.__name__ and cname.endswith("Source"):
            for m in ("candidates", "observe", "branch"):
                if m in c.__dict__:
                    wrap(c, m, f"{cname}.{m}")
for obj, name, label in [
    (conf.ModelConfidence, "observe", "confidence.observe"), (conf.ModelConfidence, "path", "confidence.path"),
    (cal.GuessTracker, "offer", "tracker.offer"), (cal.GuessTracker, "record", "tracker.record"),
    (cal.Calibrator, "conditionals_of", "calibrator.conditionals_of"),
    (cal.Calibrator, "path_probabilities", "calibrator.path_probabilities"),
    (cal.Calibrator, "observe_siblings", "calibrator.observe_siblings"),
    (dr.CandidateTree, "add", "tree.add"), (dr.CandidateTree, "cap_siblings", "tree.cap_siblings"),
    (pool.SourcePool, "_correct_first_tokens", "pool._correct_first_tokens"),
    (pool.SourcePool, "propose", "pool.propose"), (pool.SourcePool, "update", "pool.update"),
    (sch, "allocate_batch", "allocate_batch"), (st, "largest", "largest"),
]:
    wrap(obj, name, label)
wrap(smp.TokenChooser, "gumbel", "chooser.gumbel")
wrap(smp.TokenChooser, "choose", "chooser.choose")
wrap(recycling.RecyclingSource, "_drawn_first", "recycle._drawn_first")
for s in sys.argv[1].split(","):
    steps = run(lm, s, int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "abcdef")
    print(f"{s} steps {steps}")
    for k, v in sorted(acc.items(), key=lambda kv: -kv[1]):
        print(f"   {k:34s} {1e3 * v / steps:.3f} ms/step")
