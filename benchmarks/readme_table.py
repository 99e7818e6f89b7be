"""Print the per-class markdown table of a `lookahead bench` summary.json (for README and notes).

    python benchmarks/readme_table.py docs/results/bench-smollm2/summary.json [--strategy lookahead]
    python benchmarks/readme_table.py docs/results/decision-smollm2/summary.json --decision
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TARGETS = {"code": 1.5, "function_calling": 1.5, "summarization": 1.3, "math": 1.3, "chat": 1.2}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("summary", type=Path)
    p.add_argument("--strategy", default="lookahead", help="the row to compare with autoregressive")
    p.add_argument("--decision", action="store_true", help="print the decision table of a multi-strategy run")
    args = p.parse_args(argv)
    s = json.loads(args.summary.read_text())
    if args.decision:
        return decision(s)
    policy_path = args.summary.with_name("policy.json")
    policy = json.loads(policy_path.read_text()) if policy_path.exists() else {"classes": {}}
    print(f"| class | n | new tokens (median) | tokens/step | acceptance | speedup (median, 95% CI) | target "
          f"| AR device-s/req | {args.strategy} device-s/req | device-s saved/req (95% CI) | wasted | policy |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for cls, entry in s["classes"].items():
        st = entry["strategies"]
        ar, la = st.get("autoregressive"), st.get(args.strategy)
        if not ar or not la or "speedup_vs_ar" not in la:
            continue
        sp, saved = la["speedup_vs_ar"], la["device_s_saved_per_request"]
        target = TARGETS.get(cls)
        acc = la.get("acceptance_rate")
        print(f"| {cls} | {la['paired_n']} | {la['new_tokens_median']:.0f} | {la['tokens_per_step']:.2f} "
              f"| {'-' if acc is None else f'{acc:.2f}'} "
              f"| **{sp['median']:.2f}x** [{sp['ci95'][0]:.2f}, {sp['ci95'][1]:.2f}] "
              f"| {'≥' + str(target) + 'x' if target else 'must not lose'} "
              f"| {ar['device_s_per_request']:.1f} | {la['device_s_per_request']:.1f} "
              f"| {saved['mean']:+.2f} [{saved['ci95'][0]:+.2f}, {saved['ci95'][1]:+.2f}] "
              f"| {la['wasted_fraction']:.0%} | {policy['classes'].get(cls, {}).get('strategy', '-')} |")
    mix = s.get("mix", {})
    if mix.get("policy_saved_pct") is not None:
        print(f"\nBlended under {mix.get('source')}: policy saves {mix['policy_saved_pct']:.1f}% of device cost "
              f"per request against autoregressive everywhere.")
    return 0


def decision(s: dict) -> int:
    """Markdown versions of the report's decision table and head-to-head table."""
    from lookahead.bench.compare import decision_rows, versus_rows

    doc = s.get("decision")
    if not doc:
        print("this summary has no decision table (it measured fewer than two strategies besides autoregressive)",
              file=sys.stderr)
        return 1
    for header, rows in (decision_rows(doc), versus_rows(doc)):
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for r in rows:
            print("| " + " | ".join(r) + " |")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
