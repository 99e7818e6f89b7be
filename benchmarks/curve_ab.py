"""A/B of two cost curves: how much the allocator's view of the device changes speed.

The allocator (engine/allocator.py) sizes every step from the model's cost curve, refined online from the
engine's own timings. This runs the default lookahead strategy twice per request, once with each curve
installed as the model's curve (each arm keeps refining its own across requests, and has its own
calibrator and recycled successors per class, as the bench keeps them), arms interleaved in alternating
order, outputs required identical. Curves come from a cost-curves.json (~/.cache/lookahead/), by the
start of their key or by their version suffix (e.g. "v2", "v3").

    lookahead workloads build --out /tmp/wl
    python benchmarks/curve_ab.py --workload /tmp/wl --curves ~/.cache/lookahead/cost-curves.json \
        --a v2 --b v3 [--per-class 8] [--from 20]

Prints per request and per class the paired speed b over a (median of a's decode time per token over
b's), tokens per step and query rows per step of each arm, then one JSON line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from paired_ab import paired_parser, run_paired  # noqa: E402

import lookahead  # noqa: E402
from lookahead.engine import costs  # noqa: E402


def pick(stored: dict[str, dict[str, float]], name: str) -> dict[str, float]:
    hits = [v for k, v in stored.items() if k.endswith(f"|{name}") or k.startswith(name)]
    if len(hits) != 1:
        sys.exit(f"{name!r} names {len(hits)} curves in the file; give a version suffix or a unique key prefix")
    return hits[0]


def main() -> int:
    ap = paired_parser(__doc__)
    ap.add_argument("--curves", type=Path, required=True, help="a cost-curves.json")
    ap.add_argument("--a", required=True, help="the first curve (version suffix or key prefix)")
    ap.add_argument("--b", required=True, help="the second curve")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    stored = json.loads(args.curves.read_text())
    lm = lookahead.load(args.model)
    lookahead.generate(lm, "hello", max_new_tokens=8)  # the model's curve slot exists from here on
    slots = costs._CURVES[lm.model]
    kind = next(iter(slots))
    curves = {name: costs.CostCurve.from_json(pick(stored, name), kind[0]) for name in (args.a, args.b)}

    def arm(name: str):
        def run(messages, calibrator, successors, n):
            slots[kind] = curves[name]  # this arm's curve, refined by its own steps
            return lookahead.generate(lm, messages, max_new_tokens=n, calibrator=calibrator, successors=successors,
                                          prefix_cache=False)
        return run

    summary = run_paired(args.workload, {name: arm(name) for name in curves}, args.a, args.b, args.per_class,
                         args.start, args.max_new_tokens)
    summary["curves_after"] = {n: [round(c(w), 3) for w in (2, 3, 4, 6, 8, 12, 16)] for n, c in curves.items()}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
