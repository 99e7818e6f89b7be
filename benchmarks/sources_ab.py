"""A/B of two sets of free sources: lookahead drawing from the sources of arm a against those of arm b.

Both arms run on held-out workload requests, interleaved in alternating order, each with its own
calibrator and recycled successors per class (as the bench keeps them); outputs must be identical.

    lookahead workloads build --out /tmp/wl
    python benchmarks/sources_ab.py --workload /tmp/wl --a suffix,recycle,cache,jacobi \\
        --b suffix,recycle,cache,jacobi,resume [--per-class 8] [--from 20] [--classes code,math]
    python benchmarks/sources_ab.py --workload /tmp/wl --a suffix,recycle --b suffix,recycle --b-states on

`--a-states on` / `--b-states on`: that arm runs with LookaheadConfig(hidden_states=True) (the suffix
source's nearest-occurrence flag); its label then ends in "/states".

Prints per request and per class the paired speed of b over a (paired_ab.py), then one JSON line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from paired_ab import paired_parser, run_paired  # noqa: E402

import lookahead  # noqa: E402
from lookahead import LookaheadConfig  # noqa: E402


def main() -> int:
    ap = paired_parser(__doc__)
    ap.add_argument("--a", required=True, help="comma-separated source names of arm a (candidates/registry.py)")
    ap.add_argument("--b", required=True, help="comma-separated source names of arm b")
    ap.add_argument("--a-states", choices=("on", "off"), default="off", help="arm a's LookaheadConfig.hidden_states")
    ap.add_argument("--b-states", choices=("on", "off"), default="off", help="arm b's LookaheadConfig.hidden_states")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lm = lookahead.load(args.model)
    lookahead.generate(lm, "hello", max_new_tokens=8)  # probe and cost curve before any timing

    def arm(names: str, states: str):
        cfg = LookaheadConfig(sources=tuple(names.split(",")), hidden_states=states == "on")
        return lambda messages, calibrator, successors, n: lookahead.generate(
            lm, messages, max_new_tokens=n, lookahead=cfg, calibrator=calibrator, successors=successors,
            prefix_cache=False)

    a = args.a + ("/states" if args.a_states == "on" else "")
    b = args.b + ("/states" if args.b_states == "on" else "")
    if a == b:
        raise SystemExit("arms a and b are the same: change --b or --b-states")
    summary = run_paired(args.workload, {a: arm(args.a, args.a_states), b: arm(args.b, args.b_states)}, a, b,
                         args.per_class, args.start, args.max_new_tokens, classes=args.classes.split(","))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
