"""Paired A/B of the cost curve's estimator (engine/costs.py `observe`, `_learned`), from one stored curve.

Arms: "stored-first" (the estimator before this change: a width's correction an average that starts at
the stored curve, worth ten steps; a width never timed as stored) and "timed-first" (the shipped one:
the stored curve worth two steps; a width never timed costs at most the line between the timed widths
beside it). Both start from the curve this machine has stored for the model (the one `lookahead.load`
reads), each refines its own across requests; benchmarks/paired_ab.py runs every request in both arms,
interleaved, outputs required identical.

    python docs/results/curve-untimed-widths/ab.py --workload /tmp/wl [--per-class 10] [--from 20]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))

from paired_ab import paired_parser, run_paired  # noqa: E402

import lookahead  # noqa: E402
from lookahead.engine import costs  # noqa: E402


class StoredFirst(costs.CostCurve):
    """The estimator before: corrections an exponential average from 1; widths never timed as stored."""

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self._fixes: dict[tuple[int, bool], float] = {}  # (width, key views) -> the average

    def _learned(self, k: int, views: bool) -> float:
        return (self._base(k) + (self.views if views else 0.0)) * self._fixes.get((k, views), 1.0)

    def observe(self, width: int, seconds: float, views: bool = False) -> None:
        k, d = max(width, self.floor or 1, 1), self.decay
        unit = seconds / (self._base(k) + (self.views if views else 0.0))
        self._scale = unit if self._scale is None else d * self._scale + (1 - d) * unit
        self._fixes[(k, views)] = d * self._fixes.get((k, views), 1.0) + (1 - d) * unit / self._scale
        self._cheapest = None


def main() -> int:
    args = paired_parser(__doc__).parse_args()
    torch.set_num_threads(args.threads)
    lm = lookahead.load(args.model)
    lookahead.generate(lm, "hello", max_new_tokens=8)  # the model's curve slot exists from here on
    slots = costs._CURVES[lm.model]
    kind = next(iter(slots))
    stored = slots[kind].to_json()
    print("stored curve:", stored, flush=True)
    curves = {"stored-first": StoredFirst.from_json(stored, kind[0]), "timed-first": costs.CostCurve.from_json(stored, kind[0])}

    def arm(name: str):  # noqa: ANN202
        def run(messages, calibrator, successors, n):  # noqa: ANN001, ANN202
            slots[kind] = curves[name]
            return lookahead.generate(lm, messages, max_new_tokens=n, calibrator=calibrator, successors=successors)
        return run

    summary = run_paired(args.workload, {name: arm(name) for name in curves}, "stored-first", "timed-first",
                         args.per_class, args.start, args.max_new_tokens, classes=args.classes.split(","))
    summary["curves_after"] = {n: [round(c(w, w), 3) for w in range(1, 13)] for n, c in curves.items()}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
