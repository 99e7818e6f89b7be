"""Paired A/B of one calibration setting (CalibrationConfig.agreement, .backoff, .depth_backoff, .siblings,
.confidence, or .decay or .confidence_decay at two values; engine/calibration.py), with calibrators shared per class as the bench and the
server keep them.

Runs lookahead with the switch off and on over held-out workload requests, arms interleaved in
alternating order, each arm with its own calibrator and recycled successors per class; outputs must be
identical (the calibrator only sizes steps). benchmarks/ab_calibration.py is the older, per-request
variant (a fresh calibrator for every request, autoregressive timed alongside).

    lookahead workloads build --out /tmp/wl
    python benchmarks/calibration_paired_ab.py depth_backoff --workload /tmp/wl [--per-class 8] [--from 20]
    python benchmarks/calibration_paired_ab.py decay --values 0.98,0.995 --workload /tmp/wl

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

SWITCHES = ("agreement", "backoff", "depth_backoff", "siblings", "confidence")
NUMBERS = ("decay", "confidence_decay")  # settings compared at two values given by --values


def main() -> int:
    ap = paired_parser(__doc__)
    ap.add_argument("switch", choices=SWITCHES + NUMBERS)
    ap.add_argument("--values", help="for a numeric setting: the two values, A,B (e.g. 0.98,0.995)")
    args = ap.parse_args()
    if args.switch in NUMBERS:
        if not args.values or len(args.values.split(",")) != 2:
            ap.error(f"{args.switch} needs --values A,B")
        settings = {v.strip(): float(v) for v in args.values.split(",")}
        CalibrationConfig(**{args.switch: min(settings.values())})  # refuse a bad value before loading
        CalibrationConfig(**{args.switch: max(settings.values())})
    elif args.values:
        ap.error(f"{args.switch} is on or off; --values is for {', '.join(NUMBERS)}")
    else:
        settings = {"off": False, "on": True}
    a, b = settings
    torch.set_num_threads(args.threads)
    lm = lookahead.load(args.model)
    lookahead.generate(lm, "hello", max_new_tokens=8)  # probe and cost curve before any timing

    def arm(messages, calibrator, successors, n):  # type: ignore[no-untyped-def]
        return lookahead.generate(lm, messages, max_new_tokens=n, calibrator=calibrator, successors=successors,
                                  prefix_cache=False)

    factories = {name: (lambda v=value: Calibrator(CalibrationConfig(**{args.switch: v})))
                 for name, value in settings.items()}
    summary = run_paired(args.workload, {a: arm, b: arm}, a, b, args.per_class, args.start,
                         args.max_new_tokens, calibrators=factories, classes=args.classes.split(","))
    print(json.dumps({"switch": args.switch, **summary}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
