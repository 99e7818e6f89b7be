"""summary.json statistics, computed from results.jsonl rows only. Definitions are in docs/bench.md.

Repeats of one (request, strategy) are first reduced to their median, giving one record per
request; class statistics are over those records. Paired comparisons use the requests measured
under both the strategy and autoregressive, in request-id order.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from lookahead.bench.config import BASELINE

NUMERIC = ("prompt_tokens", "new_tokens", "steps", "guesses_verified", "guesses_accepted", "processed_tokens",
           "prefill_s", "decode_s", "total_s", "ttft_s", "device_s", "cpu_s")
SPEEDUP_SEED = 0
SAVING_SEED = 1

Record = dict[str, Any]
Records = dict[tuple[str, str], dict[str, Record]]  # (class, strategy) -> request id -> record


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default method)."""
    xs = sorted(values)
    if not xs:
        raise ValueError("percentile of no values")
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def bootstrap_ci(values: Sequence[float], stat: Callable[..., Any], *, resamples: int, seed: int) -> list[float]:
    """Percentile bootstrap 95% interval: resample indices with numpy default_rng(seed).integers."""
    arr = np.asarray(values, dtype=float)
    n = len(arr)
    if n == 0:
        raise ValueError("bootstrap of no values")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(resamples, n))
    stats = stat(arr[idx], axis=1)
    lo, hi = np.percentile(stats, [2.5, 97.5])
    return [float(lo), float(hi)]


def per_request(rows: Sequence[dict[str, Any]]) -> Records:
    """Median over repeats of every numeric field, per (class, strategy, request)."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["class"], r["strategy"], r["request_id"])].append(r)
    out: Records = defaultdict(dict)
    for (cls, strat, rid), rs in sorted(groups.items()):
        rec: Record = {f: float(statistics.median(float(r[f]) for r in rs)) for f in NUMERIC}
        # prompt tokens the prefix cache supplied (rows written before it existed have none)
        rec["cached_tokens"] = float(statistics.median(float(r.get("cached_tokens", 0)) for r in rs))
        rec["repeats"] = len(rs)
        rec["mismatches"] = sum(1 for r in rs if r.get("identical") is False)
        rec["checked"] = sum(1 for r in rs if r.get("identical") is not None)
        out[(cls, strat)][rid] = rec
    return dict(out)


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def strategy_stats(recs: dict[str, Record], price_per_hour: float) -> dict[str, Any]:
    vals = list(recs.values())
    total = [v["total_s"] for v in vals]
    device = [v["device_s"] for v in vals]
    new = [v["new_tokens"] for v in vals]
    dev_mean = statistics.fmean(device)
    return {
        "n": len(vals),
        "new_tokens_mean": statistics.fmean(new),
        "new_tokens_median": float(statistics.median(new)),
        "acceptance_rate": _ratio(sum(v["guesses_accepted"] for v in vals), sum(v["guesses_verified"] for v in vals)),
        "tokens_per_step": _ratio(sum(new), sum(v["steps"] for v in vals)),
        "latency_p50_s": percentile(total, 50),
        "latency_p95_s": percentile(total, 95),
        "ttft_p50_s": percentile([v["ttft_s"] for v in vals], 50),
        "decode_tokens_per_s": _ratio(sum(new), sum(v["decode_s"] for v in vals)),
        "device_s_per_request": dev_mean,
        "cpu_s_per_request": statistics.fmean(v["cpu_s"] for v in vals),
        "cost_per_request_usd": dev_mean * price_per_hour / 3600.0,
        "prefill_share": _ratio(sum(v["prefill_s"] for v in vals), sum(total)),
        "cached_tokens_per_request": statistics.fmean(v.get("cached_tokens", 0.0) for v in vals),
        "wasted_fraction": max(0.0, 1.0 - (_ratio(sum(new), sum(v["processed_tokens"] for v in vals)) or 1.0)),
        "identity_checked": sum(int(v["checked"]) for v in vals),
        "mismatches": sum(int(v["mismatches"]) for v in vals),
    }


def head_to_head(a: dict[str, Record], b: dict[str, Record], *, resamples: int) -> dict[str, Any] | None:
    """How many times faster `a` ran than `b` on the requests measured under both: per request b's latency
    over a's, then the median and its bootstrap 95% interval. None when no request was measured under both."""
    ids = sorted(set(a) & set(b))
    if not ids:
        return None
    ratios = [b[i]["total_s"] / a[i]["total_s"] for i in ids]
    return {
        "paired_n": len(ids),
        "median": float(statistics.median(ratios)),
        "ci95": bootstrap_ci(ratios, np.median, resamples=resamples, seed=SPEEDUP_SEED),
    }


def paired_stats(base: dict[str, Record], other: dict[str, Record], *, price_per_hour: float,
                 resamples: int) -> dict[str, Any] | None:
    speedup = head_to_head(other, base, resamples=resamples)
    if speedup is None:
        return None
    ids = sorted(set(base) & set(other))
    saved = [base[i]["device_s"] - other[i]["device_s"] for i in ids]
    saved_mean = statistics.fmean(saved)
    return {
        "paired_n": speedup.pop("paired_n"),
        "speedup_vs_ar": speedup,
        "device_s_saved_per_request": {
            "mean": saved_mean,
            "ci95": bootstrap_ci(saved, np.mean, resamples=resamples, seed=SAVING_SEED),
        },
        "cost_saved_per_request_usd": saved_mean * price_per_hour / 3600.0,
        "processed_token_ratio_vs_ar": _ratio(sum(other[i]["processed_tokens"] for i in ids),
                                              sum(base[i]["processed_tokens"] for i in ids)),
        "device_s_ratio_vs_ar": _ratio(sum(other[i]["device_s"] for i in ids), sum(base[i]["device_s"] for i in ids)),
    }


def class_tables(records: Records, strategies: Sequence[str], *, price_per_hour: float,
                 resamples: int) -> dict[str, dict[str, Any]]:
    """Per class: per strategy statistics, and paired comparisons against autoregressive."""
    classes = sorted({c for c, _ in records})
    out: dict[str, dict[str, Any]] = {}
    for cls in classes:
        base = records.get((cls, BASELINE), {})
        table: dict[str, Any] = {}
        for s in strategies:
            recs = records.get((cls, s))
            if not recs:
                continue
            st = strategy_stats(recs, price_per_hour)
            if s != BASELINE and base:
                paired = paired_stats(base, recs, price_per_hour=price_per_hour, resamples=resamples)
                if paired:
                    st.update(paired)
            table[s] = st
        out[cls] = {"strategies": table}
    return out


def token_sources(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (class, strategy), over every row: query tokens per step (rows the passes computed, padding
    included) and each source's share of the new tokens ("model": the model's own token of each step;
    empty where the runner does not report sources, e.g. transformers' generate)."""
    steps: dict[tuple[str, str], float] = defaultdict(float)
    processed: dict[tuple[str, str], float] = defaultdict(float)
    by_source: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in rows:
        key = (r["class"], r["strategy"])
        steps[key] += r["steps"]
        processed[key] += r["processed_tokens"]
        for src, n in (r.get("accepted_by_source") or {}).items():
            by_source[key][src] += int(n)
    out = {}
    for key in steps:
        counts = by_source.get(key, {})
        total = sum(counts.values())
        out[key] = {"query_tokens_per_step": _ratio(processed[key], steps[key]),
                    "accepted_share_by_source": {src: n / total for src, n in sorted(counts.items(), key=lambda kv: -kv[1])}
                    if total else {}}
    return out


def speedup_samples(records: Records, cls: str, strategy: str) -> list[tuple[float, float, str]]:
    """(new tokens, speedup, request id) per request paired with autoregressive."""
    base = records.get((cls, BASELINE), {})
    other = records.get((cls, strategy), {})
    return [(base[i]["new_tokens"], base[i]["total_s"] / other[i]["total_s"], i) for i in sorted(set(base) & set(other))]
