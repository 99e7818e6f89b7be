"""A/B of one calibration switch (CalibrationConfig.backoff or .siblings, engine/calibration.py).

Per request, interleaved (order alternating): autoregressive, lookahead with the switch on and with it
off, each with a fresh calibrator (as `lookahead bench` runs requests). Prints the median speedup over
autoregressive per arm and the median paired ratio on / off, per class; one JSON line per request goes
to OUT/CHANGE-DTYPE.jsonl. Outputs must equal autoregressive decoding's ("same").

    lookahead workloads build --out workloads/public
    python benchmarks/ab_calibration.py siblings float32 high_entropy:20,chat:12,code:12
    python benchmarks/ab_calibration.py siblings bfloat16 high_entropy:10,chat:10
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import lookahead
from lookahead.bench.run import encode
from lookahead.config import SamplingConfig
from lookahead.engine.calibration import CalibrationConfig, Calibrator
from lookahead.workloads.format import parse_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("change", choices=["backoff", "siblings"])
    ap.add_argument("dtype")
    ap.add_argument("plan", help="class:count,... e.g. high_entropy:20,chat:12")
    ap.add_argument("--workload", default="workloads/public")
    ap.add_argument("--out", default="docs/results/calibration-ab")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    torch.set_num_threads(2)
    lm = lookahead.load("smollm2-135m-instruct", dtype=args.dtype)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    out = open(Path(args.out) / f"{args.change}-{args.dtype}.jsonl", "a")

    def run(ids: list[int], sampling: SamplingConfig, arm: str) -> tuple[float, lookahead.GenerationResult]:
        kw: dict = {"strategy": "autoregressive"} if arm == "AR" else {
            "strategy": "lookahead", "calibrator": Calibrator(CalibrationConfig(**{args.change: arm == "on"}))}
        t = time.perf_counter()
        r = lookahead.generate(lm, ids, max_new_tokens=args.max_new_tokens, sampling=sampling, prefix_cache=False, **kw)
        return time.perf_counter() - t, r

    for cls, n in ((c, int(k)) for c, k in (x.split(":") for x in args.plan.split(","))):
        speedups: dict[str, list[float]] = {"on": [], "off": []}
        for i, req in enumerate(parse_workload(Path(args.workload) / f"{cls}.jsonl")[:n]):
            ids = encode(lm, req)
            sampling = SamplingConfig(temperature=req.temperature, top_k=req.top_k, top_p=req.top_p,
                                      seed=req.effective_seed % (2**63))
            arms = ["AR", "on", "off"] if i % 2 == 0 else ["AR", "off", "on"]
            res = {a: run(ids, sampling, a) for a in arms}
            row: dict = {"cls": cls, "id": req.id}
            for a, (t, r) in res.items():
                row[a] = {"s": round(t, 4), "tps": round(r.stats.tokens_per_step, 3), "q": r.stats.processed_tokens,
                          "same": r.token_ids == res["AR"][1].token_ids}
                if a != "AR":
                    speedups[a].append(res["AR"][0] / t)
            out.write(json.dumps(row) + "\n")
            out.flush()
        paired = statistics.median(b / p for b, p in zip(speedups["on"], speedups["off"]))
        print(cls, args.dtype, {a: round(statistics.median(v), 3) for a, v in speedups.items()},
              f"paired {args.change} on/off", round(paired, 3), flush=True)


if __name__ == "__main__":
    main()
