"""The allocator's own time: record every allocate_batch call of some lookahead requests (what it was
given, the priced widths, what it returned), then time the current allocate_batch on the recording and
check it returns the same allocations. Record once (at any commit), time at each commit to compare:
  WL=<workloads> python alloc_time.py record calls.pkl     (5 classes x 3 requests, SKIP 60)
  python alloc_time.py time calls.pkl"""
import os
import pickle
import statistics
import sys
import time

from lookahead.engine.allocator import allocate_batch

if sys.argv[1] == "record":
    import torch

    import lookahead
    import lookahead.scheduler.scheduler as sch
    from lookahead.candidates.recycling import SuccessorTable
    from lookahead.config import SamplingConfig
    from lookahead.engine.calibration import Calibrator
    from lookahead.generation import generate
    from lookahead.workloads.format import parse_workload

    torch.set_num_threads(2)
    M = lookahead.load("smollm2-135m-instruct", dtype="bfloat16")
    calls = []

    def spy(requests, cost, **kw):
        out = allocate_batch(requests, cost, **kw)
        if kw.get("views_cost") is None:
            kw = {k: v for k, v in kw.items() if k != "views_cost"}
        calls.append(dict(requests=list(requests), prices={k: cost(k) for k in range(1, 65)}, kw=kw, out=out))
        return out

    sch.allocate_batch = spy
    for c in ("code", "chat", "function_calling", "summarization", "high_entropy"):
        cal, suc = Calibrator(), SuccessorTable()
        for r in parse_workload(f"{os.environ.get('WL', 'workloads')}/{c}.jsonl")[60:63]:
            samp = SamplingConfig(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, seed=r.effective_seed)
            generate(M, r.chat() if r.prompt is None else r.prompt, raw=r.prompt is not None, max_new_tokens=128,
                     sampling=samp, calibrator=cal, successors=suc)
    pickle.dump(calls, open(sys.argv[2], "wb"))
    print(len(calls), "calls recorded")
else:
    calls = pickle.load(open(sys.argv[2], "rb"))

    def run():
        return [allocate_batch(x["requests"], x["prices"].__getitem__, **x["kw"]) for x in calls]

    differ = sum(o != x["out"] for o, x in zip(run(), calls))
    times = []
    for _ in range(7):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    print(f"{len(calls)} calls, {differ} allocations differ from the recording, "
          f"{1e6 * statistics.median(times) / len(calls):.1f} us a call (median of 7 sweeps)")
