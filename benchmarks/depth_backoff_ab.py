"""A/B of the calibrator's depth backoff (CalibrationConfig.depth_backoff, engine/calibration.py): the
prior of a guess's token at depth d raised to the estimate at depth d - 1, against the fixed prior 1/3.

Runs lookahead with each setting on held-out workload requests, arms interleaved in alternating order,
each arm with its own calibrator and recycled successors per class (as the bench keeps them); outputs
must be identical (the calibrator only sizes steps).

    lookahead workloads build --out /tmp/wl
    python benchmarks/depth_backoff_ab.py --workload /tmp/wl [--per-class 8] [--from 20]

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


def main() -> int:
    ap = paired_parser(__doc__)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lm = lookahead.load(args.model)
    lookahead.generate(lm, "hello", max_new_tokens=8)  # probe and cost curve before any timing

    def arm(messages, calibrator, successors, n):  # type: ignore[no-untyped-def]
        return lookahead.generate(lm, messages, max_new_tokens=n, calibrator=calibrator, successors=successors)

    factories = {setting: (lambda on=(setting == "on"): Calibrator(CalibrationConfig(depth_backoff=on)))
                 for setting in ("off", "on")}
    summary = run_paired(args.workload, {"off": arm, "on": arm}, "off", "on", args.per_class, args.start,
                         args.max_new_tokens, calibrators=factories)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
