"""The report's figures (matplotlib, Agg backend), each written as a PNG."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lookahead.bench.config import BASELINE
from lookahead.bench.stats import Records

PALETTE = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c", "#ccb974")


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _colors(names: Sequence[str]) -> dict[str, str]:
    return {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def speedup(summary: dict[str, Any], strategies: Sequence[str], path: Path) -> Path:
    plt = _plt()
    classes = list(summary["classes"])
    others = [s for s in strategies if s != BASELINE]
    col = _colors(others)
    fig, ax = plt.subplots(figsize=(8, 0.6 + 0.45 * len(classes) * max(1, len(others))))
    h = 0.8 / max(1, len(others))
    for j, s in enumerate(others):
        ys, med, lo, hi = [], [], [], []
        for i, c in enumerate(classes):
            sp = summary["classes"][c]["strategies"].get(s, {}).get("speedup_vs_ar")
            if sp:
                ys.append(i + j * h - 0.4 + h / 2)
                med.append(sp["median"])
                lo.append(sp["median"] - sp["ci95"][0])
                hi.append(sp["ci95"][1] - sp["median"])
        ax.barh(ys, med, height=h * 0.9, color=col[s], label=s, xerr=[lo, hi], capsize=3)
    ax.axvline(1.0, color="black", lw=1)
    ax.set_yticks(range(len(classes)), classes)
    ax.invert_yaxis()
    ax.set_xlabel("speedup vs autoregressive (median of per-request ratios, 95% bootstrap CI)")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title("Speedup per class")
    return _save(fig, path)


def tokens_per_step(records: Records, classes: Sequence[str], strategy: str, path: Path) -> Path:
    plt = _plt()
    data, labels = [], []
    for c in classes:
        recs = records.get((c, strategy), {})
        vals = [r["new_tokens"] / r["steps"] for r in recs.values() if r["steps"] > 0]
        if vals:
            data.append(vals)
            labels.append(c)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    if data:
        ax.boxplot(data, tick_labels=labels, showmeans=True)
    ax.axhline(1.0, color="black", lw=1, ls=":")
    ax.set_ylabel("tokens per step (per request)")
    ax.set_title(f"Tokens per step under {strategy}")
    return _save(fig, path)


def cost(summary: dict[str, Any], strategies: Sequence[str], price: float, path: Path) -> Path:
    plt = _plt()
    classes = list(summary["classes"])
    col = _colors(list(strategies))
    fig, ax = plt.subplots(figsize=(9, 3.8))
    w = 0.8 / len(strategies)
    for j, s in enumerate(strategies):
        xs, ys = [], []
        for i, c in enumerate(classes):
            st = summary["classes"][c]["strategies"].get(s)
            if st:
                xs.append(i - 0.4 + w * (j + 0.5))
                ys.append(st["device_s_per_request"])
        ax.bar(xs, ys, width=w * 0.95, color=col[s], label=s)
    ax.set_xticks(range(len(classes)), classes, rotation=15)
    ax.set_ylabel("device-seconds per request")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.25)  # room for the legend above the bars
    if price > 0:
        sec = ax.secondary_yaxis("right", functions=(lambda x: x * price / 3600 * 1e6,
                                                     lambda y: y / price * 3600 / 1e6))
        sec.set_ylabel(f"micro-USD per request at ${price:g}/h")
    ax.legend(fontsize=8, ncol=len(strategies), loc="upper center")
    ax.set_title("Device-seconds and cost per request, before (autoregressive) and after")
    return _save(fig, path)


def speedup_vs_length(records: Records, summary: dict[str, Any], strategy: str, path: Path) -> Path:
    plt = _plt()
    classes = list(summary["classes"])
    col = _colors(classes)
    fig, ax = plt.subplots(figsize=(8, 4))
    xmax = 1.0
    for c in classes:
        base, other = records.get((c, BASELINE), {}), records.get((c, strategy), {})
        ids = sorted(set(base) & set(other))
        xs = [base[i]["new_tokens"] for i in ids]
        ys = [base[i]["total_s"] / other[i]["total_s"] for i in ids]
        if xs:
            xmax = max(xmax, max(xs))
            ax.scatter(xs, ys, s=14, alpha=0.7, color=col[c], label=c)
    for c in classes:
        cr = summary["classes"][c].get("crossover", {}).get(strategy)
        n = cr and cr.get("break_even_new_tokens")
        if n and 0 < n <= xmax * 1.5:
            ax.axvline(n, color=col[c], ls="--", lw=1)
    ax.axhline(1.0, color="black", lw=1, label="break-even (speedup 1)")
    ax.set_xlabel("output length (new tokens)")
    ax.set_ylabel(f"speedup of {strategy}")
    ax.set_title("Per-request speedup against output length (dashed: fitted break-even length)")
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


def blended(summary: dict[str, Any], path: Path) -> Path:
    plt = _plt()
    mix = summary["mix"]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    if "before_usd" in mix:
        labels = ["autoregressive"] + [f"{s} everywhere" for s in mix["after"]] + ["recommended policy"]
        values = [mix["before_usd"]] + [a["blended_cost_usd"] for a in mix["after"].values()] + [mix["policy_usd"]]
        bars = ax.bar(range(len(values)), [v * 1e6 for v in values], color=PALETTE[: len(values)])
        for b, v in zip(bars, values):
            pct = (mix["before_usd"] - v) / mix["before_usd"] * 100 if mix["before_usd"] else 0.0
            ax.annotate(f"{pct:+.1f}%", (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom",
                        fontsize=8)
        ax.set_xticks(range(len(values)), labels, rotation=10, fontsize=8)
    ax.set_ylabel("blended micro-USD per request")
    ax.set_title("Blended cost per request under the traffic mix (label: saving vs autoregressive)")
    return _save(fig, path)


def profile(doc: dict[str, Any], path: Path) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 3.8))
    for i, c in enumerate(doc["contexts"]):
        ks = [int(k) for k in c["t_s"]]
        ts = [v * 1000 for v in c["t_s"].values()]
        color = PALETTE[i % len(PALETTE)]
        ax.plot(ks, ts, marker="o", ms=3, color=color, label=f"context {c['context']}")
        ax.axhline(c["t1_s"] * 1000 * doc["tolerance"], color=color, ls=":", lw=1)
        ax.axvline(c["free_budget_tokens"], color=color, ls="--", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("query tokens per forward (k)")
    ax.set_ylabel("forward time t(k), ms")
    ax.set_title("Serving-path profile (dotted: 1.1 x t(1); dashed: free verification budget)")
    ax.legend(fontsize=8)
    return _save(fig, path)
