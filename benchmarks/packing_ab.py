"""A/B of packed linear weights (models/packing.py): the same model loaded packed and plain, each decoding
held-out workload requests autoregressively and with lookahead, the four arms interleaved in rotating
order, each lookahead arm with its own calibrator and recycled successors per class.

Packing must change speed only: all four arms must produce the same tokens (the script exits on any
difference). Prints per class the paired speed of packed over plain (median over requests of plain's
decode time per token over packed's) for each strategy, lookahead's speedup over autoregressive decoding
on each model, and the prefill time ratio; then one JSON line.

    lookahead workloads build --out /tmp/wl
    python benchmarks/packing_ab.py --workload /tmp/wl [--per-class 4] [--from 40]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from paired_ab import CLASSES, paired_parser  # noqa: E402

import lookahead  # noqa: E402
from lookahead.candidates.recycling import SuccessorTable  # noqa: E402
from lookahead.engine.calibration import Calibrator  # noqa: E402

ARMS = ("plain/ar", "packed/ar", "plain/la", "packed/la")


def main() -> int:
    ap = paired_parser(__doc__)
    ap.set_defaults(per_class=4, start=40)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    models = {"plain": lookahead.load(args.model, pack=False), "packed": lookahead.load(args.model)}
    if not models["packed"].packed:
        sys.exit("no layer of this model packs on this device (models/packing.py): nothing to compare")
    for lm in models.values():
        lookahead.generate(lm, "hello", max_new_tokens=8)  # probe and cost curve before any timing

    rows = []
    for cls in CLASSES:
        with (args.workload / f"{cls}.jsonl").open() as f:
            reqs = [json.loads(line) for line in f][args.start : args.start + args.per_class]
        learned = {arm: (Calibrator(), SuccessorTable()) for arm in ARMS}
        for i, req in enumerate(reqs):
            got = {}
            for arm in ARMS[i % 4 :] + ARMS[: i % 4]:  # rotate the order: a drift spreads over all arms
                model, strategy = arm.split("/")
                kwargs = {"strategy": "autoregressive"} if strategy == "ar" else \
                    {"calibrator": learned[arm][0], "successors": learned[arm][1]}
                res = lookahead.generate(models[model], req["messages"], max_new_tokens=args.max_new_tokens,
                                         prefix_cache=False, **kwargs)  # type: ignore[arg-type]
                got[arm] = (tuple(res.token_ids), res.stats.decode_s / max(res.stats.new_tokens, 1),
                            res.stats.prefill_s)
            if len({tokens for tokens, *_ in got.values()}) != 1:
                sys.exit(f"{req['id']}: the arms produced different tokens; that is a bug")
            ms = {arm: got[arm][1] for arm in ARMS}
            rows.append({"class": cls, "ar": ms["plain/ar"] / ms["packed/ar"], "la": ms["plain/la"] / ms["packed/la"],
                         "la_vs_ar_plain": ms["plain/ar"] / ms["plain/la"],
                         "la_vs_ar_packed": ms["packed/ar"] / ms["packed/la"],
                         "prefill": got["plain/ar"][2] / max(got["packed/ar"][2], 1e-9),
                         "ms_per_token": {arm: round(1000 * v, 2) for arm, v in ms.items()}})
            r = rows[-1]
            print(f"{cls:16s} {req['id']:32s} packed/plain AR {r['ar']:.3f} LA {r['la']:.3f}  LA/AR plain "
                  f"{r['la_vs_ar_plain']:.3f} packed {r['la_vs_ar_packed']:.3f}  ms/tok {r['ms_per_token']}", flush=True)

    keys = ("ar", "la", "la_vs_ar_plain", "la_vs_ar_packed", "prefill")
    summary: dict[str, object] = {"requests": len(rows), "identical": True}
    for cls in (*CLASSES, "all"):
        rs = [r for r in rows if cls in ("all", r["class"])]
        summary[cls] = {k: round(statistics.median(r[k] for r in rs), 3) for k in keys}
        s = summary[cls]
        print(f"{cls:16s} packed over plain: AR {s['ar']:.3f}x  LA {s['la']:.3f}x  prefill {s['prefill']:.3f}x   "
              f"LA over AR: plain {s['la_vs_ar_plain']:.3f}x  packed {s['la_vs_ar_packed']:.3f}x")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
