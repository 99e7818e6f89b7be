"""A/B of exact trees: lookahead whose exact steps verify whole trees at aligned key offsets, against
the same strategy verifying each tree's first chain only.

At reduced precision an exact step could verify only the tree's likeliest chain: a node of another
branch sees masked keys between its visible ones, which moves them to other lanes and pairs of the
kernels' reductions. With aligned offsets (engine/query.py align_tree) each node's key sits where those
reductions treat it as in autoregressive decoding, so whole trees are verified at the cost of masked
keys. This runs both on held-out workload requests, arms interleaved in alternating order, each with
its own calibrator and recycled successors per class (as the bench keeps them); outputs must be
identical.

    lookahead workloads build --out /tmp/wl
    python benchmarks/trees_ab.py --workload /tmp/wl [--per-class 8] [--from 20]

Prints per request and per class the paired speed of trees over first chains (paired_ab.py), then one
JSON line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from paired_ab import paired_parser, run_paired  # noqa: E402

import lookahead  # noqa: E402
from lookahead.engine.numerics import width_probe  # noqa: E402


def main() -> int:
    ap = paired_parser(__doc__)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lm = lookahead.load(args.model)
    lookahead.generate(lm, "hello", max_new_tokens=8)  # probe and cost curve before any timing
    if not width_probe(lm.model).aligned_exact:
        sys.exit("the width probe did not find aligned trees exact on this model and device: nothing to compare")

    def arm(trees: bool):
        return lambda messages, calibrator, successors, n: lookahead.generate(
            lm, messages, max_new_tokens=n, calibrator=calibrator, successors=successors, aligned_trees=trees,
            prefix_cache=False)

    summary = run_paired(args.workload, {"chain": arm(False), "trees": arm(True)}, "chain", "trees",
                         args.per_class, args.start, args.max_new_tokens)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
