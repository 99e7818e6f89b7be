"""The decision table: every measured strategy side by side, per class, and the primary one head to head.

It answers the question an operator choosing a strategy asks: on this class, which lossless strategy
is fastest, which is cheapest, and by how much does lookahead beat each alternative on the *same*
requests. Only runs that measure at least two strategies besides autoregressive get one.

Head-to-head numbers are paired like `speedup_vs_ar`: per request, the rival's latency divided by the
primary's (above 1: the primary is faster), then the median over requests with a bootstrap 95%
interval (stats.head_to_head).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from lookahead.bench.config import BASELINE
from lookahead.bench.stats import Records, head_to_head


def primary_strategy(strategies: Sequence[str]) -> str:
    """The strategy the report is about: plain `lookahead` if measured, else the first non-baseline one."""
    others = [s for s in strategies if s != BASELINE]
    return "lookahead" if "lookahead" in others else others[0]


def decision_table(records: Records, classes: Mapping[str, Any], strategies: Sequence[str], *,
                   resamples: int) -> dict[str, Any] | None:
    """summary.json's "decision" entry, or None when fewer than two strategies compete with autoregressive."""
    measured = {s for _, s in records}
    rivals = [s for s in strategies if s != BASELINE and s in measured]
    if len(rivals) < 2:
        return None
    primary = primary_strategy(rivals)
    out: dict[str, Any] = {"primary": primary, "strategies": [BASELINE, *rivals], "classes": {}}
    for cls, entry in classes.items():
        table = entry["strategies"]
        # Speedup over autoregressive (the baseline is 1 by definition). A strategy can be fastest or
        # cheapest only if every one of its outputs was checked against autoregressive decoding and
        # matched (transformers' sampled reference rows are unchecked, so they never qualify).
        speedup = {s: (1.0 if s == BASELINE else table[s]["speedup_vs_ar"]["median"])
                   for s in out["strategies"] if s in table and (s == BASELINE or table[s].get("speedup_vs_ar"))}
        lossless = [s for s in speedup if s == BASELINE or _all_checked_identical(records[(cls, s)].values())]
        # Device-seconds per request over the requests every listed strategy measured, so that the
        # cheapest is chosen on equal work.
        common = set.intersection(*(set(records[(cls, s)]) for s in speedup)) if speedup else set()
        device = {s: statistics.fmean(r["device_s"] for i, r in records[(cls, s)].items() if i in common or not common)
                  for s in speedup}
        versus = {}
        for rival in rivals:
            if rival == primary:
                continue
            h = head_to_head(records.get((cls, primary), {}), records.get((cls, rival), {}), resamples=resamples)
            if h is not None:
                versus[rival] = h
        out["classes"][cls] = {
            "speedup_vs_ar": speedup,
            "device_s_per_request": device,
            "fastest": max(lossless, key=lambda s: speedup[s]) if lossless else None,
            "cheapest": min(lossless, key=lambda s: device[s]) if lossless else None,
            "primary_vs": versus,
        }
    return out


def _all_checked_identical(recs: Iterable[Mapping[str, Any]]) -> bool:
    return all(r["checked"] == r["repeats"] and r["mismatches"] == 0 for r in recs)


def _interval(h: Mapping[str, Any]) -> str:
    return f"{h['median']:.2f}x [{h['ci95'][0]:.2f}, {h['ci95'][1]:.2f}]"


def decision_rows(doc: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """(header, rows): per class, each strategy's median speedup and device-seconds per request."""
    strategies = doc["strategies"]
    header = ["class", *strategies, "fastest", "cheapest"]
    rows = []
    for cls, c in doc["classes"].items():
        cells = [f"{c['speedup_vs_ar'][s]:.2f}x, {c['device_s_per_request'][s]:.2f} s"
                 if s in c["speedup_vs_ar"] else "-" for s in strategies]
        rows.append([cls, *cells, c["fastest"] or "-", c["cheapest"] or "-"])
    return header, rows


def versus_rows(doc: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """(header, rows): how many times faster the primary ran than each rival, per class, with intervals."""
    rivals = [s for s in doc["strategies"] if s not in (BASELINE, doc["primary"])]
    header = ["class", *(f"{doc['primary']} vs {r}" for r in rivals)]
    rows = [[cls, *(_interval(c["primary_vs"][r]) if r in c["primary_vs"] else "-" for r in rivals)]
            for cls, c in doc["classes"].items()]
    return header, rows


def versus_verdict(doc: Mapping[str, Any]) -> str:
    """One sentence per rival: the classes where the primary is confidently faster, and confidently slower."""
    primary = doc["primary"]
    parts = []
    for rival in (s for s in doc["strategies"] if s not in (BASELINE, primary)):
        ahead, behind = [], []
        for cls, c in doc["classes"].items():
            h = c["primary_vs"].get(rival)
            if h and h["ci95"][0] > 1.0:
                ahead.append(cls)
            elif h and h["ci95"][1] < 1.0:
                behind.append(cls)
        parts.append(f"against {rival}, {primary} is faster on {', '.join(ahead) or 'no class'} and slower on "
                     f"{', '.join(behind) or 'no class'} (95% intervals clear of 1)")
    return "Head to head, " + "; ".join(parts) + "."
