"""Log each step's allocator input (the request's Candidates, the priced widths) and the greedy answer,
for offline replays of allocation rules."""
import json, os, sys, pickle, torch
import lookahead
from lookahead.generation import generate
import lookahead.scheduler.scheduler as SCH
torch.set_num_threads(2)
WL = os.environ.get("WL", "workloads")  # lookahead workloads build --out workloads
cls, n, skip = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
m = lookahead.load("smollm2-135m-instruct")
reqs = [json.loads(l) for l in open(f"{WL}/{cls}.jsonl")][skip:skip + n]
steps = []
orig = SCH.allocate_batch
cur = {}
def spy(wanted, cost, *, max_width=64, max_rows=None, views_cost=None):
    prices = [cost(k) for k in range(1, 65)]
    steps.append(dict(req=cur["i"], L=cur["req"].context.__len__(), cand=wanted[0], prices=prices,
                      max_width=max_width, max_rows=max_rows, views=views_cost is not None))
    return orig(wanted, cost, max_width=max_width, max_rows=max_rows, views_cost=views_cost)
SCH.allocate_batch = spy
import lookahead.scheduler.request as RQ
op = RQ.Request.propose
def propose(self, *a, **k):
    cur["req"] = self
    return op(self, *a, **k)
RQ.Request.propose = propose
answers = []
for i, r in enumerate(reqs):
    cur["i"] = i
    g = generate(m, r["messages"], max_new_tokens=128, strategy="lookahead")
    prompt = m.encode(r["messages"])
    answers.append(list(prompt) + list(g.token_ids))
    print(i, len(g.token_ids), round(g.stats.tokens_per_step, 2), flush=True)
pickle.dump(dict(steps=steps, answers=answers), open(f"steps-{cls}-{skip}.pkl", "wb"))
