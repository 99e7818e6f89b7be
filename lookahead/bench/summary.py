"""Turn results.jsonl rows into summary.json and policy.json, and print the readable table."""

from __future__ import annotations

import datetime as _dt
import platform
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from lookahead.bench.compare import decision_rows, decision_table, versus_rows
from lookahead.bench.config import BASELINE, BenchConfig
from lookahead.bench.economics import blend, crossovers, workload_shares
from lookahead.bench.policy import build_policy
from lookahead.bench.profile import prefill_decode_share
from lookahead.bench.stats import class_tables, per_request, token_sources

SUMMARY_VERSION = 1


def _versions() -> dict[str, str]:
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}


def relevant_rows(rows: Sequence[dict[str, Any]], request_ids: set[str], strategies: Sequence[str]) -> list[dict[str, Any]]:
    """The rows of this run's selection (a directory may hold rows of a larger earlier selection)."""
    keep = set(strategies)
    return [r for r in rows if r["request_id"] in request_ids and r["strategy"] in keep]


def summarize(rows: Sequence[dict[str, Any]], cfg: BenchConfig, *, class_counts: Mapping[str, int],
              model_name: str, profile: dict[str, Any] | None, skipped: Sequence[dict[str, str]],
              extra_meta: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(summary, policy) documents from the rows alone (plus the run's settings)."""
    records = per_request(rows)
    classes = class_tables(records, cfg.strategies, price_per_hour=cfg.price_per_hour, resamples=cfg.bootstrap)
    cross = crossovers(records, cfg.strategies)
    sources = token_sources(rows)
    for cls, entry in classes.items():
        entry["requests"] = len({r["request_id"] for r in rows if r["class"] == cls})
        entry["crossover"] = cross.get(cls, {})
        for s, st in entry["strategies"].items():
            st.update(sources.get((cls, s), {}))
    lk = cfg.lookahead
    meta: dict[str, Any] = {
        "generator": "lookahead bench",
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "model": cfg.model,
        "model_name": model_name,
        "dtype": cfg.dtype,
        "threads": cfg.threads,
        "max_new_tokens": cfg.max_new_tokens,
        "lookahead": {"window": lk.window, "ngram": lk.ngram, "guesses": lk.guesses},
        "strategies": list(cfg.strategies),
        "repeats": cfg.repeats,
        "limit_per_class": cfg.limit_per_class,
        "price_per_hour_usd": cfg.price_per_hour,
        "bootstrap_resamples": cfg.bootstrap,
        "workloads": list(cfg.workloads),
        "source": str(cfg.out),
        **_versions(),
        **dict(extra_meta or {}),
    }
    policy_meta = {k: meta[k] for k in ("generator", "date", "model", "dtype", "max_new_tokens", "price_per_hour_usd")}
    policy_meta["source"] = str(cfg.out / "summary.json")
    policy = build_policy(classes, cross, cfg.strategies, lk, policy_meta)
    if cfg.mix is not None:
        shares, mix_source = dict(cfg.mix), "given (--mix)"
    else:
        shares, mix_source = workload_shares(class_counts), "the workload's own class shares"
    choice = dict(policy["meta"]["measured_as"])  # class -> measured label (policy entries drop /cache)
    mix = blend(classes, shares, cfg.strategies, choice)
    mix["source"] = mix_source
    checked = sum(1 for r in rows if r.get("identical") is not None)
    bad = [r for r in rows if r.get("identical") is False]
    summary = {
        "version": SUMMARY_VERSION,
        "meta": meta,
        "rows": len(rows),
        "requests": len({r["request_id"] for r in rows}),
        "classes": classes,
        "mix": mix,
        "identity": {
            "checked_rows": checked,
            "mismatches": len(bad),
            "mismatched": [{k: r[k] for k in ("request_id", "class", "strategy", "repeat")} for r in bad],
            "note": "token ids compared with autoregressive decoding of the same request (same seed); "
                    "transformers reference rows are only checked on greedy requests",
        },
        "skipped": list(skipped),
        "prefill_decode_share": prefill_decode_share(rows),
        "profile": profile,
        "policy": policy,
        "decision": decision_table(records, classes, cfg.strategies, resamples=cfg.bootstrap),
    }
    return summary, policy


def _f(x: Any, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def table(summary: dict[str, Any]) -> str:
    """The readable per-class table printed at the end of a run."""
    head = (f"{'class':<17} {'strategy':<17} {'n':>4} {'tok/step':>8} {'accept':>7} {'p50 s':>7} "
            f"{'speedup [95% CI]':>22} {'dev-s/req':>10} {'$/req':>11}")
    lines = [head, "-" * len(head)]
    for cls, entry in summary["classes"].items():
        for s, st in entry["strategies"].items():
            sp = st.get("speedup_vs_ar")
            speed = "baseline" if s == BASELINE else (
                f"{sp['median']:.2f}x [{sp['ci95'][0]:.2f}, {sp['ci95'][1]:.2f}]" if sp else "-")
            lines.append(
                f"{cls:<17} {s:<17} {st['n']:>4} {_f(st['tokens_per_step'], '.2f'):>8} "
                f"{_f(st['acceptance_rate'], '.2f'):>7} {st['latency_p50_s']:>7.3f} {speed:>22} "
                f"{st['device_s_per_request']:>10.4f} {st['cost_per_request_usd']:>11.3g}"
            )
    if summary.get("decision"):
        for header, rows in (decision_rows(summary["decision"]), versus_rows(summary["decision"])):
            lines.append("")
            lines.append(" | ".join(header))
            lines.extend(" | ".join(r) for r in rows)
    mix = summary["mix"]
    if "before_usd" in mix:
        lines.append("")
        lines.append(f"traffic mix ({mix['source']}): " + ", ".join(f"{c} {w:.0%}" for c, w in mix["shares"].items()))
        lines.append(f"  blended $/request: autoregressive {mix['before_usd']:.3g}; recommended policy "
                     f"{mix['policy_usd']:.3g} (saving {_f(mix['policy_saved_pct'], '+.1f')}%)")
        for s, a in mix["after"].items():
            be = a["break_even_winning_share"]
            lines.append(f"  {s} everywhere: {a['blended_cost_usd']:.3g} (saving {_f(a['saved_pct'], '+.1f')}%); "
                         f"winning classes are {a['winning_share']:.0%} of traffic, break-even at "
                         f"{'-' if be is None else format(be, '.0%')}")
    ident = summary["identity"]
    lines.append("")
    lines.append(f"identity: {ident['checked_rows']} rows checked, {ident['mismatches']} mismatches")
    pol = summary["policy"]
    lines.append("policy: " + ", ".join(f"{c}={d['strategy']}" for c, d in pol["classes"].items())
                 + f"; default={pol['default']['strategy']}")
    return "\n".join(lines)


def class_counts(requests: Sequence[Any]) -> dict[str, int]:
    return dict(Counter(r.cls for r in requests))
