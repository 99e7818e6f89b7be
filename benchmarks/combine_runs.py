"""Per-class speedups over the requests of several `lookahead bench` runs taken together.

    python benchmarks/combine_runs.py RUN_A/results.jsonl RUN_B/results.jsonl

Each run measured its own requests (say requests 1-20 and 21-40 of every class); pooled, every class has
twice the requests, so a median is less at the mercy of which texts a class happened to draw. Ratios are
per request and paired (the same request under both strategies, identical outputs), then the median
and its bootstrap 95% interval, exactly as the bench's own summary computes them (lookahead.bench.stats).
Prints a Markdown table: lookahead and prompt lookup against autoregressive, lookahead against prompt
lookup, lookahead's tokens per step, the median over decode time alone, and mismatched outputs.
"""

from __future__ import annotations

import argparse
import json
import statistics

from lookahead.bench.stats import head_to_head, per_request

RESAMPLES = 2000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="results.jsonl files of runs over distinct requests")
    args = parser.parse_args()
    rows = [json.loads(line) for path in args.results for line in open(path, encoding="utf-8") if line.strip()]
    records = per_request(rows)
    print("| class | requests | lookahead vs AR [95% CI] | prompt lookup vs AR | lookahead vs prompt lookup [95% CI] "
          "| lookahead tokens/step | lookahead vs AR, decode only | mismatches |")
    print("|---|---|---|---|---|---|---|---|")
    for cls in sorted({c for c, _ in records}):
        ar, la, pl = (records[(cls, s)] for s in ("autoregressive", "lookahead", "prompt_lookup"))
        vs_ar, pl_ar, vs_pl = (head_to_head(a, b, resamples=RESAMPLES) for a, b in ((la, ar), (pl, ar), (la, pl)))
        assert vs_ar and pl_ar and vs_pl, f"{cls}: no request measured under every strategy"
        per_step = sum(v["new_tokens"] for v in la.values()) / sum(v["steps"] for v in la.values())
        decode = statistics.median(ar[i]["decode_s"] / la[i]["decode_s"] for i in la if i in ar)
        mismatches = sum(int(v["mismatches"]) for recs in (la, pl) for v in recs.values())
        lo, hi = vs_ar["ci95"]
        print(f"| {cls} | {vs_ar['paired_n']} | {vs_ar['median']:.2f}x [{lo:.2f}, {hi:.2f}] "
              f"| {pl_ar['median']:.2f}x | {vs_pl['median']:.2f}x [{vs_pl['ci95'][0]:.2f}, {vs_pl['ci95'][1]:.2f}] "
              f"| {per_step:.2f} | {decode:.2f}x | {mismatches} |")


if __name__ == "__main__":
    main()
