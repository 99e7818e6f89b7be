"""policy.json: the recommended strategy per class, in the lookahead.policy format (what `lookahead serve
--policy` reads).

A class gets a non-autoregressive strategy only when the lower end of the bootstrap 95% interval of
device-seconds saved per request is above zero, over at least MIN_PAIRED requests; among such
strategies the one saving most on average wins. Where the fitted break-even output length is above one token, a rule sends requests
of that class whose max_tokens is below it to autoregressive decoding.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lookahead.bench.config import BASELINE
from lookahead.bench.variants import parse_strategy
from lookahead.config import STRATEGIES as POLICY_STRATEGIES
from lookahead.config import LookaheadConfig
from lookahead.policy import POLICY_VERSION, load_policy

MIN_PAIRED = 5  # fewer paired requests than this never earn a non-autoregressive recommendation


def decision(label: str, lk: LookaheadConfig) -> dict[str, Any]:
    """The policy entry of a measured strategy label ('lookahead', 'speculative/draft=self:24', ...)."""
    return parse_strategy(label, POLICY_STRATEGIES).decision(lk).to_dict()


def choose(table: Mapping[str, Any], candidates: Sequence[str]) -> tuple[str, str]:
    """(strategy, reason) for one class's strategy table."""
    best, best_saved = BASELINE, 0.0
    notes = []
    for s in candidates:
        st = table.get(s)
        if not st or "device_s_saved_per_request" not in st:
            continue
        saved = st["device_s_saved_per_request"]
        lo = saved["ci95"][0]
        n = int(st.get("paired_n", 0))
        notes.append(f"{s}: saves {saved['mean']:.4f} s/request, 95% CI [{lo:.4f}, {saved['ci95'][1]:.4f}], n={n}"
                     + (f" (under {MIN_PAIRED}: too few to recommend)" if n < MIN_PAIRED else ""))
        if n >= MIN_PAIRED and lo > 0 and saved["mean"] > best_saved:
            best, best_saved = s, saved["mean"]
    if best == BASELINE:
        reason = (f"no strategy saves device-seconds with confidence (95% interval lower bound > 0, over at least "
                  f"{MIN_PAIRED} requests)")
    else:
        reason = f"{best} saves device-seconds with confidence (95% interval lower bound > 0)"
    return best, reason + ("; " + "; ".join(notes) if notes else "")


def build_policy(classes: Mapping[str, dict[str, Any]], crossover: Mapping[str, dict[str, Any]],
                 strategies: Sequence[str], lk: LookaheadConfig, meta: Mapping[str, Any]) -> dict[str, Any]:
    """The policy document. `strategies`: what was measured; only engine strategies the server knows
    can be recommended (transformers reference rows never are)."""
    candidates = [s for s in strategies if s != BASELINE and s.split("/")[0] in POLICY_STRATEGIES]
    per_class: dict[str, Any] = {}
    measured_as: dict[str, str] = {}  # class -> the label whose rows back its decision
    reasons: dict[str, str] = {}
    rules: list[dict[str, Any]] = []
    for cls in sorted(classes):
        choice, why = choose(classes[cls]["strategies"], candidates)
        per_class[cls] = decision(choice, lk)
        measured_as[cls] = choice
        reasons[cls] = why
        if choice != BASELINE:
            n_star = crossover.get(cls, {}).get(choice, {}).get("break_even_new_tokens")
            if (crossover.get(cls, {}).get(choice, {}).get("wins_for") == "longer outputs"
                    and n_star is not None and n_star > 1):
                rules.append({"if": {"class": cls, "max_tokens_below": int(math.ceil(n_star))}, "strategy": BASELINE})
    # Traffic of an unmeasured class: a non-autoregressive default only when every measured class agrees
    # on the same decision (labels differing only in /cache agree: the cache is not part of a decision).
    chosen = {json.dumps(d, sort_keys=True) for d in per_class.values()}
    default = json.loads(next(iter(chosen))) if len(chosen) == 1 else decision(BASELINE, lk)
    # Savings measured with a cross-request cache need the server to keep one for those classes.
    cached = sorted(c for c, label in measured_as.items() if parse_strategy(label, POLICY_STRATEGIES).ngram_cache)
    extra: dict[str, Any] = {}
    if cached:
        extra = {"ngram_cache_classes": cached,
                 "serve_with": f"lookahead serve --policy policy.json --ngram-cache {','.join(cached)}"}
    return {
        "version": POLICY_VERSION,
        "default": default,
        "classes": per_class,
        "rules": rules,
        "meta": {**dict(meta), "reasons": reasons, "measured_as": measured_as, **extra},
    }


def validate(path: str | Path) -> None:
    """Read the written file back with the policy format's own loader (the one `lookahead serve
    --policy` uses); raises lookahead.policy.PolicyError if it does not validate."""
    load_policy(path)
