"""report.md and a self-contained report.html (figures embedded as base64 PNGs; no scripts, no links out).

Both are rendered from one list of blocks, so they always say the same thing. The verdict comes first.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lookahead.bench import plots
from lookahead.bench.compare import decision_rows, primary_strategy, versus_rows, versus_verdict
from lookahead.bench.config import BASELINE
from lookahead.bench.policy import decision as policy_decision
from lookahead.bench.stats import Records
from lookahead.config import LookaheadConfig

Block = tuple[Any, ...]  # ("h1"|"h2"|"p"|"b", text) | ("table", header, rows) | ("img", file, caption)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1f}%"


def _saved(pct: float | None) -> str:
    if pct is None:
        return "saving unknown"
    return f"{pct:.1f}% cheaper" if pct >= 0 else f"{-pct:.1f}% more expensive"


def _num(x: Any, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _shape(label: str, lk: dict[str, int]) -> str:
    """' (W=.., N=.., G=..)' for a lookahead label (its own overrides applied), else ''."""
    if label.split("/")[0] not in ("lookahead", "lookahead_jacobi"):
        return ""
    run = LookaheadConfig(window=lk["window"], ngram=lk["ngram"], guesses=lk["guesses"])
    c = policy_decision(label, run)["lookahead"]
    return f" (W={c['window']}, N={c['ngram']}, G={c['guesses']})"


def verdict(summary: dict[str, Any], primary: str) -> list[Block]:
    out: list[Block] = []
    mix, ident, pol = summary["mix"], summary["identity"], summary["policy"]
    lk = summary["meta"]["lookahead"]
    if "before_usd" in mix:
        out.append(("b", f"Verdict: under the traffic mix ({mix['source']}), the recommended policy costs "
                         f"${mix['policy_usd'] * 1000:.3g} per 1,000 requests against ${mix['before_usd'] * 1000:.3g} "
                         f"for autoregressive decoding ({_saved(mix['policy_saved_pct'])})."))
    wins, loses, others = [], [], []
    measured_as = pol["meta"].get("measured_as", {})
    for cls, entry in summary["classes"].items():
        st = entry["strategies"].get(primary, {})
        sp, saved = st.get("speedup_vs_ar"), st.get("device_s_saved_per_request")
        if not sp or not saved:
            continue
        text = f"{cls} {sp['median']:.2f}x [{sp['ci95'][0]:.2f}, {sp['ci95'][1]:.2f}]"
        chosen = measured_as.get(cls, "autoregressive")
        if chosen == primary:
            wins.append(text)
        elif chosen == "autoregressive":
            loses.append(text)
        else:
            others.append(f"{cls} ({chosen})")
    out.append(("p", f"{primary}{_shape(primary, lk)} is recommended for: "
                     f"{', '.join(wins) or 'no class'}. Kept on autoregressive decoding (no confident saving): "
                     f"{', '.join(loses) or 'no class'}."
                     + (f" Another strategy saves more on: {', '.join(others)}." if others else "")
                     + " Numbers are median speedups of " + primary + " with 95% bootstrap intervals."))
    if ident["mismatches"]:
        out.append(("b", f"WARNING: {ident['mismatches']} of {ident['checked_rows']} checked outputs differ from "
                         "autoregressive decoding. Lossless decoding is broken; do not deploy this build."))
    else:
        out.append(("p", f"Losslessness: all {ident['checked_rows']} checked outputs are token-for-token identical "
                         "to autoregressive decoding."))
    return out


def class_table(summary: dict[str, Any]) -> Block:
    header = ["class", "strategy", "n", "new tokens (mean/median)", "acceptance", "tokens/step", "latency p50/p95 s",
              "TTFT p50 s", "prefill share", "prompt tokens reused", "decode tok/s", "device-s/request", "$/request",
              "processed tokens vs AR",
              "speedup [95% CI]", "device-s saved [95% CI]"]
    rows = []
    for cls, entry in summary["classes"].items():
        for s, st in entry["strategies"].items():
            sp, sv = st.get("speedup_vs_ar"), st.get("device_s_saved_per_request")
            rows.append([
                cls, s, str(st["n"]), f"{st['new_tokens_mean']:.1f} / {st['new_tokens_median']:.0f}",
                _num(st["acceptance_rate"], ".3f"), _num(st["tokens_per_step"], ".2f"),
                f"{st['latency_p50_s']:.3f} / {st['latency_p95_s']:.3f}", f"{st['ttft_p50_s']:.3f}",
                _num(st.get("prefill_share"), ".0%"), f"{st.get('cached_tokens_per_request', 0.0):.0f}",
                _num(st["decode_tokens_per_s"], ".1f"), f"{st['device_s_per_request']:.4f}",
                f"{st['cost_per_request_usd']:.3g}", _num(st.get("processed_token_ratio_vs_ar"), ".2f"),
                "baseline" if s == BASELINE else (f"{sp['median']:.2f}x [{sp['ci95'][0]:.2f}, {sp['ci95'][1]:.2f}]"
                                                  if sp else "-"),
                "-" if not sv else f"{sv['mean']:.4f} [{sv['ci95'][0]:.4f}, {sv['ci95'][1]:.4f}]",
            ])
    return ("table", header, rows)


def sources_block(summary: dict[str, Any]) -> Block:
    """Per class and strategy: tokens and query rows per step, and which source each new token came from."""
    rows = []
    for cls, entry in summary["classes"].items():
        for s, st in entry["strategies"].items():
            shares = st.get("accepted_share_by_source") or {}
            rows.append([cls, s, _num(st["tokens_per_step"], ".2f"), _num(st.get("query_tokens_per_step"), ".2f"),
                         ", ".join(f"{src} {v:.0%}" for src, v in shares.items()) or "-"])
    return ("table", ["class", "strategy", "tokens/step", "query tokens/step", "new tokens by source"], rows)


def decision_blocks(doc: dict[str, Any]) -> list[Block]:
    return [("h2", "Decision table"),
            ("p", "Per class: each strategy's median speedup over autoregressive decoding (paired per request) "
                  "and its device-seconds per request; the fastest and cheapest lossless strategy."),
            ("table", *decision_rows(doc)),
            ("p", versus_verdict(doc)),
            ("table", *versus_rows(doc))]


def mix_blocks(summary: dict[str, Any]) -> list[Block]:
    mix = summary["mix"]
    if "before_usd" not in mix:
        return [("p", mix.get("note", "no traffic mix could be applied"))]
    out: list[Block] = [("p", "Shares (" + mix["source"] + "): "
                         + ", ".join(f"{c} {w:.1%}" for c, w in mix["shares"].items()) + ".")]
    for s, a in mix["after"].items():
        be = a["break_even_winning_share"]
        out.append(("p", f"{s} on all traffic: ${a['blended_cost_usd']:.3g} per request ({_saved(a['saved_pct'])} "
                         f"vs autoregressive). Classes where it wins carry {a['winning_share']:.1%} of traffic; the blend "
                         f"turns positive once they carry {'-' if be is None else format(be, '.1%')}."))
        rows = [[p["class"], f"{p['share']:.1%}", f"{p['cost_before_usd']:.3g}", f"{p['cost_after_usd']:.3g}",
                 _pct(p["saved_pct"]), f"{p['weighted_saved_usd']:.3g}", p["verdict"]] for p in a["per_class"]]
        out.append(("table", ["class", "share", "$/req before", "$/req after", "saved", "weighted $ saved", "verdict"],
                    rows))
    return out


def crossover_block(summary: dict[str, Any]) -> Block:
    rows = []
    for cls, entry in summary["classes"].items():
        for s, c in entry.get("crossover", {}).items():
            rows.append([cls, s, _num(c["break_even_new_tokens"], ".0f"), c["wins_for"],
                         _num(c["break_even_acceptance_rate"], ".3f"), _num(c["observed_acceptance_rate"], ".3f"),
                         _num(c["break_even_tokens_per_step"], ".2f"), _num(c["observed_tokens_per_step"], ".2f")])
    return ("table", ["class", "strategy", "break-even output tokens", "wins for", "break-even acceptance",
                      "observed acceptance", "break-even tokens/step", "observed tokens/step"], rows)


def profile_blocks(doc: dict[str, Any] | None, shares: dict[str, dict[str, float]]) -> list[Block]:
    out: list[Block] = []
    if doc:
        rows = []
        for c in doc["contexts"]:
            r = c["recommended"]
            rows.append([str(c["context"]), f"{c['t1_s'] * 1000:.2f}", str(c["free_budget_tokens"]),
                         "yes" if c["bandwidth_bound"] else "no (compute-bound)",
                         f"{r['window']},{r['ngram']},{r['guesses']}" if r else "none fit"])
        out.append(("p", f"Device: {doc['device']}. Free verification budget: largest k with t(k) <= "
                         f"{doc['tolerance']} x t(1)."))
        out.append(("table", ["context", "t(1) ms", "free budget k", "bandwidth-bound", "W,N,G that fit"], rows))
        for s in doc.get("skipped", []):
            out.append(("p", f"Context {s['context']} skipped: {s['reason']}."))
    else:
        out.append(("p", "No serving-path profile in this run (see `lookahead profile`)."))
    rows = [[cls, s, f"{v:.1%}", f"{1 - v:.1%}"] for cls, per in shares.items() for s, v in per.items()]
    out.append(("table", ["class", "strategy", "prefill share of time", "decode share"], rows))
    return out


def blocks(summary: dict[str, Any], figures: dict[str, Path], primary: str) -> list[Block]:
    meta = summary["meta"]
    out: list[Block] = [("h1", "Lookahead decoding: per-class benchmark and cost report")]
    out += verdict(summary, primary)
    if "speedup" in figures:
        out.append(("img", figures["speedup"], "Speedup per class"))
    if summary.get("decision"):
        out += decision_blocks(summary["decision"])
    out.append(("p", f"Model {meta['model']} ({meta['dtype']}), up to {meta['max_new_tokens']} new tokens, "
                     f"{meta['repeats']} repeat(s), {summary['requests']} requests, {summary['rows']} measurements, "
                     f"price ${meta['price_per_hour_usd']:g} per device-hour. torch {meta['torch']}, transformers "
                     f"{meta['transformers']}. Generated {meta['date']}."))
    out += [("h2", "Per class and strategy"), class_table(summary)]
    out += [("h2", "Where the tokens come from"),
            ("p", "Query tokens per step count every row the passes computed (padding to the width floor included); "
                  "\"model\" is the model's own token that every step yields, the rest were guesses it verified."),
            sources_block(summary)]
    out += [("h2", "Cost under the traffic mix")] + mix_blocks(summary)
    if "blended" in figures:
        out.append(("img", figures["blended"], "Blended cost per request"))
    out += [("h2", "Where it breaks even"), crossover_block(summary)]
    for key, cap in (("speedup_vs_length", "Per-request speedup against output length"),
                     ("tokens_per_step", "Tokens per step per class"),
                     ("cost", "Device-seconds and cost per request")):
        if key in figures:
            out.append(("img", figures[key], cap))
    out += [("h2", "Serving-path profile")] + profile_blocks(summary.get("profile"), summary["prefill_decode_share"])
    if "profile" in figures:
        out.append(("img", figures["profile"], "Forward time against query tokens"))
    pol = summary["policy"]
    out += [("h2", "Recommended policy (policy.json)"),
            ("table", ["class", "strategy", "why"],
             [[c, d["strategy"], pol["meta"]["reasons"].get(c, "")] for c, d in pol["classes"].items()])]
    for rule in pol["rules"]:
        out.append(("p", f"Rule: class {rule['if'].get('class')} with max_tokens below "
                         f"{rule['if'].get('max_tokens_below')} -> {rule['strategy']} (below the break-even length)."))
    if pol["meta"].get("serve_with"):
        out.append(("p", f"Savings for {', '.join(pol['meta']['ngram_cache_classes'])} were measured with a "
                         f"cross-request n-gram cache: serve with `{pol['meta']['serve_with']}`."))
    ident = summary["identity"]
    out += [("h2", "Identity check"), ("p", f"{ident['checked_rows']} rows checked, {ident['mismatches']} mismatches. "
                                            + ident["note"] + ".")]
    if ident["mismatched"]:
        out.append(("table", ["request", "class", "strategy", "repeat"],
                    [[m["request_id"], m["class"], m["strategy"], str(m["repeat"])] for m in ident["mismatched"]]))
    if summary["skipped"]:
        out += [("h2", "Skipped requests"),
                ("table", ["request", "class", "reason"], [[s["request_id"], s["class"], s["reason"]]
                                                           for s in summary["skipped"]])]
    return out


def to_markdown(bs: Sequence[Block], base: Path) -> str:
    lines: list[str] = []
    for b in bs:
        kind = b[0]
        if kind == "h1":
            lines += [f"# {b[1]}", ""]
        elif kind == "h2":
            lines += [f"## {b[1]}", ""]
        elif kind == "p":
            lines += [b[1], ""]
        elif kind == "b":
            lines += [f"**{b[1]}**", ""]
        elif kind == "img":
            lines += [f"![{b[2]}]({b[1].relative_to(base).as_posix()})", ""]
        elif kind == "table":
            header, rows = b[1], b[2]
            lines.append("| " + " | ".join(header) + " |")
            lines.append("|" + "---|" * len(header))
            lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
            lines.append("")
    return "\n".join(lines)


CSS = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:1.5em auto;padding:0 1em;color:#222}"
       "table{border-collapse:collapse;font-size:13px;margin:.5em 0 1em}td,th{border:1px solid #ccc;padding:3px 6px;"
       "text-align:left}th{background:#f3f3f3}img{max-width:100%;display:block;margin:.5em 0}"
       ".verdict{font-size:1.15em;background:#eef6ee;padding:.6em;border-left:4px solid #55a868}")


def to_html(bs: Sequence[Block], title: str) -> str:
    e = html.escape
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{e(title)}</title>",
             '<link rel="icon" href="data:,">', f"<style>{CSS}</style></head><body>"]
    for b in bs:
        kind = b[0]
        if kind in ("h1", "h2"):
            parts.append(f"<{kind}>{e(b[1])}</{kind}>")
        elif kind == "p":
            parts.append(f"<p>{e(b[1])}</p>")
        elif kind == "b":
            parts.append(f'<p class="verdict"><strong>{e(b[1])}</strong></p>')
        elif kind == "img":
            data = base64.b64encode(Path(b[1]).read_bytes()).decode("ascii")
            parts.append(f'<figure><img alt="{e(b[2])}" src="data:image/png;base64,{data}">'
                         f"<figcaption>{e(b[2])}</figcaption></figure>")
        elif kind == "table":
            head = "".join(f"<th>{e(h)}</th>" for h in b[1])
            body = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in r) + "</tr>" for r in b[2])
            parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(out: Path, summary: dict[str, Any], records: Records, strategies: Sequence[str]) -> dict[str, Path]:
    """Figures under out/plots/, then out/report.md and out/report.html. Returns the figure paths."""
    pdir = out / "plots"
    pdir.mkdir(parents=True, exist_ok=True)
    primary = primary_strategy(strategies)
    classes = list(summary["classes"])
    price = float(summary["meta"]["price_per_hour_usd"])
    figures = {
        "speedup": plots.speedup(summary, strategies, pdir / "speedup.png"),
        "tokens_per_step": plots.tokens_per_step(records, classes, primary, pdir / "tokens_per_step.png"),
        "cost": plots.cost(summary, strategies, price, pdir / "cost.png"),
        "speedup_vs_length": plots.speedup_vs_length(records, summary, primary, pdir / "speedup_vs_length.png"),
        "blended": plots.blended(summary, pdir / "blended.png"),
    }
    if summary.get("profile") and summary["profile"]["contexts"]:
        figures["profile"] = plots.profile(summary["profile"], pdir / "profile.png")
    bs = blocks(summary, figures, primary)
    (out / "report.md").write_text(to_markdown(bs, out), encoding="utf-8")
    (out / "report.html").write_text(to_html(bs, "lookahead benchmark report"), encoding="utf-8")
    return figures
