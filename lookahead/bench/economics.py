"""Crossover fits and traffic-mix blending (docs/bench.md explains every formula)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from lookahead.bench.config import BASELINE
from lookahead.bench.stats import Record, Records


def linear_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float] | None:
    """Least-squares y = a + b x; None when x does not vary."""
    n = len(xs)
    if n < 2:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        return None
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - b * mx, b


def _step_time(recs: Sequence[Record]) -> float | None:
    per = [r["decode_s"] / r["steps"] for r in recs if r["steps"] > 0]
    return float(statistics.median(per)) if per else None


def cost_model(recs: Sequence[Record]) -> tuple[tuple[float, float], str] | None:
    """(fixed seconds, seconds per output token) for device_s as a function of output length.

    Least squares of device_s on new_tokens when output lengths vary enough (>= 3 distinct values
    spanning >= 20% of the longest); otherwise (e.g. every request hit max_new_tokens) the fixed
    part is the median prefill time and the per-token part is the pooled (device_s - prefill_s) /
    new_tokens.
    """
    if not recs:
        return None
    xs = [r["new_tokens"] for r in recs]
    if len(set(xs)) >= 3 and (max(xs) - min(xs)) >= 0.2 * max(xs):
        fit = linear_fit(xs, [r["device_s"] for r in recs])
        if fit is not None:
            return fit, "least squares"
    new = sum(xs)
    if new <= 0:
        return None
    fixed = float(statistics.median(r["prefill_s"] for r in recs))
    return (fixed, sum(r["device_s"] - r["prefill_s"] for r in recs) / new), "prefill + per-token cost"


def crossover(base: Mapping[str, Record], other: Mapping[str, Record]) -> dict[str, Any]:
    """Where `other` breaks even with autoregressive on device-seconds, for one class.

    Output length: with device_s = a + b * new_tokens for each strategy (cost_model), the two are
    equal at n* = (a1 - a0) / (b0 - b1). Acceptance: a step of `other` costs r times an
    autoregressive step (median decode_s / steps), so it breaks even at r tokens per step; with v
    guesses verified per step (pooled) and tokens_per_step = 1 + acceptance * v, that is
    acceptance* = (r - 1) / v.
    """
    ids = sorted(set(base) & set(other))
    b = [base[i] for i in ids]
    o = [other[i] for i in ids]
    out: dict[str, Any] = {"paired_n": len(ids)}
    mb, mo = cost_model(b), cost_model(o)
    out["fit_ar"] = None if mb is None else {"fixed_s": mb[0][0], "per_token_s": mb[0][1], "method": mb[1]}
    out["fit"] = None if mo is None else {"fixed_s": mo[0][0], "per_token_s": mo[0][1], "method": mo[1]}
    tokens: float | None = None
    wins_for = "unknown"
    if mb is not None and mo is not None:
        (a0, b0), (a1, b1) = mb[0], mo[0]
        if b1 < b0:
            tokens = max(0.0, (a1 - a0) / (b0 - b1))
            wins_for = "longer outputs" if tokens > 0 else "always"
        elif b1 > b0:
            tokens = max(0.0, (a0 - a1) / (b1 - b0))
            wins_for = "shorter outputs" if tokens > 0 else "never"
        else:
            wins_for = "always" if a1 < a0 else "never"
    out["break_even_new_tokens"] = tokens
    out["wins_for"] = wins_for
    tb, to = _step_time(b), _step_time(o)
    ratio = to / tb if tb and to else None
    steps = sum(r["steps"] for r in o)
    verified_per_step = sum(r["guesses_verified"] for r in o) / steps if steps else 0.0
    out["step_cost_ratio"] = ratio
    out["break_even_tokens_per_step"] = ratio
    out["verified_per_step"] = verified_per_step
    out["break_even_acceptance_rate"] = (ratio - 1.0) / verified_per_step if ratio and verified_per_step > 0 else None
    acc_num = sum(r["guesses_accepted"] for r in o)
    acc_den = sum(r["guesses_verified"] for r in o)
    out["observed_acceptance_rate"] = acc_num / acc_den if acc_den else None
    new = sum(r["new_tokens"] for r in o)
    out["observed_tokens_per_step"] = new / steps if steps else None
    return out


def crossovers(records: Records, strategies: Sequence[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for cls in sorted({c for c, _ in records}):
        base = records.get((cls, BASELINE))
        if not base:
            continue
        per = {s: crossover(base, records[(cls, s)]) for s in strategies
               if s != BASELINE and records.get((cls, s))}
        out[cls] = per
    return out


def workload_shares(counts: Mapping[str, int]) -> dict[str, float]:
    total = sum(counts.values())
    return {c: n / total for c, n in sorted(counts.items())} if total else {}


def blend(classes: Mapping[str, dict[str, Any]], shares: Mapping[str, float], strategies: Sequence[str],
          policy_choice: Mapping[str, str]) -> dict[str, Any]:
    """Blended cost per request under the mix: before (autoregressive everywhere), after (each strategy
    everywhere), and under the recommended policy; which classes win or lose; break-even share."""
    measured = {c: w for c, w in shares.items() if c in classes and BASELINE in classes[c]["strategies"]}
    weight = sum(measured.values())
    if weight <= 0:
        return {"shares": dict(shares), "measured_weight": 0.0, "note": "no class in the mix was measured"}
    w = {c: v / weight for c, v in measured.items()}

    def cost(c: str, s: str) -> float:
        st = classes[c]["strategies"]
        return float(st.get(s, st[BASELINE])["cost_per_request_usd"])

    before = sum(w[c] * cost(c, BASELINE) for c in w)
    after: dict[str, Any] = {}
    for s in strategies:
        if s == BASELINE:
            continue
        per_class = []
        for c in sorted(w):
            ar, sc = cost(c, BASELINE), cost(c, s)
            per_class.append({
                "class": c, "share": w[c], "cost_before_usd": ar, "cost_after_usd": sc,
                "saved_usd": ar - sc, "saved_pct": (ar - sc) / ar * 100.0 if ar > 0 else None,
                "weighted_saved_usd": w[c] * (ar - sc), "verdict": "wins" if sc < ar else "loses",
            })
        blended = sum(w[c] * cost(c, s) for c in w)
        win = [p for p in per_class if p["saved_usd"] > 0]
        lose = [p for p in per_class if p["saved_usd"] <= 0]
        win_share = sum(p["share"] for p in win)
        after[s] = {
            "blended_cost_usd": blended,
            "saved_pct": (before - blended) / before * 100.0 if before > 0 else None,
            "per_class": per_class,
            "winning_share": win_share,
            "break_even_winning_share": _break_even_share(win, lose),
        }
    policy = sum(w[c] * cost(c, policy_choice.get(c, BASELINE)) for c in w)
    return {
        "shares": dict(shares),
        "measured_weight": weight,
        "before_usd": before,
        "after": after,
        "policy_usd": policy,
        "policy_saved_pct": (before - policy) / before * 100.0 if before > 0 else None,
    }


def _break_even_share(win: list[dict[str, Any]], lose: list[dict[str, Any]]) -> float | None:
    """Share s of traffic in the winning classes at which s*S_win + (1-s)*S_lose = 0 (savings per request,
    each group averaged with its own mix weights). 0 when nothing loses; None when nothing wins."""
    if not win:
        return None
    if not lose:
        return 0.0
    ws, ls = sum(p["share"] for p in win), sum(p["share"] for p in lose)
    s_win = sum(p["share"] * p["saved_usd"] for p in win) / ws if ws > 0 else statistics.fmean(p["saved_usd"] for p in win)
    s_lose = sum(p["share"] * p["saved_usd"] for p in lose) / ls if ls > 0 else statistics.fmean(p["saved_usd"] for p in lose)
    if s_win - s_lose <= 0:
        return None
    return min(1.0, max(0.0, -s_lose / (s_win - s_lose)))
