import sys, torch, lookahead
from lookahead.engine.costs import measure
from lookahead.scheduler.scheduler import device_costs
from lookahead.engine.step import StepRunner
torch.set_num_threads(2)
M = lookahead.load("smollm2-135m-instruct", dtype="bfloat16")
import lookahead.scheduler.scheduler as sch, inspect
# get the runner the engine uses
from lookahead.generation import generate
runner = None
orig = sch.Scheduler.__init__
def init(self, *a, **k):
    global runner
    orig(self, *a, **k); runner = self.runner.model
sch.Scheduler.__init__ = init
generate(M, "hi", max_new_tokens=2)
widths = list(range(1, 17))
for ctx in (256, 640):
    s = measure(M.model, runner, widths=widths, repeats=12, context=ctx)
    one = s[1]
    print(f"context {ctx}: " + " ".join(f"{k}:{s[k]/one:.2f}" for k in widths), f"(t1 {1e3*one:.1f} ms)", flush=True)
