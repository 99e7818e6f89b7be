"""Prompt f after a-e with one calibrator and successor table (as bench_prompts.py carries them), lookahead,
bf16, 4 trials: tokens a step, and the request realization every 10th step. Usage: python trap.py TRIALS [PROMPTS]"""
import sys, json, torch, lookahead, statistics
from lookahead import LookaheadConfig
from lookahead.bench.prompts import PROMPTS
from lookahead.candidates.recycling import SuccessorTable
from lookahead.engine.calibration import Calibrator
from lookahead.scheduler import request as rq
torch.set_num_threads(2)
lm = lookahead.load("smollm2-135m-instruct", dtype="bfloat16")
log = []
orig = rq.Request.absorb if hasattr(rq, "Request") else None
cls = [v for v in vars(rq).values() if isinstance(v, type) and hasattr(v, "absorb") and hasattr(v, "realization")][0]
orig = cls.absorb
def absorb(self, outcome, batch):
    log.append((round(self.realization, 3), outcome.candidate_tokens, len(outcome.accepted), outcome.query_tokens))
    return orig(self, outcome, batch)
cls.absorb = absorb
trials = int(sys.argv[1]); prompts = sys.argv[2] if len(sys.argv) > 2 else "abcdef"
for t in range(trials):
    learned = (Calibrator(), SuccessorTable())
    for p in prompts:
        log.clear()
        ids = lm.encode(PROMPTS[p])
        r = lookahead.generate(lm, ids, max_new_tokens=192, strategy="lookahead", calibrator=learned[0], successors=learned[1])
        if p == prompts[-1]:
            s = r.stats
            print(f"trial {t} {p}: tps {s.tokens_per_step:.2f} q {s.processed_tokens/s.steps:.2f} steps {s.steps} toks {len(r.token_ids)}")
            print("  first 30 steps (r, cand, acc, q):", log[:30])
            print("  r over time:", [l[0] for l in log[::10]])
