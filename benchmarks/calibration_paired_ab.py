"""Paired A/B of one calibration switch (CalibrationConfig.agreement, .backoff, .depth_backoff or .siblings,
engine/calibration.py), with calibrators shared per class as the bench and the server keep them.

Runs lookahead with the switch off and on over held-out workload requests, arms interleaved in
alternating order, each arm with its own calibrator and recycled successors per class; outputs must be
identical (the calibrator only sizes steps). benchmarks/ab_calibration.py is the older, per-request
variant (a fresh calibrator for every request, autoregressive timed alongside).

    lookahead workloads build --out /tmp/wl
    python benchmarks/calibration_paired_ab.py depth_backoff --workload /tmp/wl [--per-class 8] [--from 20]

Prints per request and per class the paired speed of on over off (paired_ab.py), then one JSON line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from paired_ab import paired_parser, run_paired  # noqa: E402

import lookahead  # noqa: E402
from lookahead.engine.calibration import CalibrationConfig, Calibrator  # noqa: E402

SWITCHES = ("agreement", "backoff", "depth_backoff", "siblings")


def main() -> int:
    ap = paired_parser(__doc__)
    ap.add_argument("switch", choices=SWITCHES)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lm = lookahead.load(args.model)
    lookahead.generate(lm, "hello", max_new_tokens=8)  # probe and cost curve before any timing

    def arm(messages, calibrator, successors, n):  # type: ignore[no-untyped-def]
        return lookahead.generate(lm, messages, max_new_tokens=n, calibrator=calibrator, successors=successors)

    factories = {setting: (lambda on=(setting == "on"): Calibrator(CalibrationConfig(**{args.switch: on})))
                 for setting in ("off", "on")}
    summary = run_paired(args.workload, {"off": arm, "on": arm}, "off", "on", args.per_class, args.start,
                         args.max_new_tokens, calibrators=factories)
    print(json.dumps({"switch": args.switch, **summary}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
