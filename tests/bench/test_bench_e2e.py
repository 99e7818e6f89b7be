"""End to end on the tiny model: every file written, every summary number recomputed from the rows."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from tests.bench.bench_helpers import STRATEGIES, WORKLOAD

from lookahead.bench.results import ROW_FIELDS

REPEATS = 2
PRICE = 2.5
RESAMPLES = 2000


def rows_of(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines() if x.strip()]


def test_run_writes_every_file(bench_run) -> None:
    res = bench_run.result
    assert res.rc == 0, res.err
    out = bench_run.out
    for name in ("results.jsonl", "run.json", "summary.json", "policy.json", "report.md", "report.html", "profile.json"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    pngs = sorted(p.name for p in (out / "plots").glob("*.png"))
    assert pngs == ["blended.png", "cost.png", "profile.png", "speedup.png", "speedup_vs_length.png", "tokens_per_step.png"]
    line = res.json_line()
    assert line["mismatches"] == 0 and line["rows"] == len(WORKLOAD) * 4 * REPEATS
    assert set(line["policy"]) == {"code", "chat", "high_entropy"}
    table = res.out.strip().splitlines()
    assert table[0].split()[:3] == ["class", "strategy", "n"]
    md = (out / "report.md").read_text()
    assert md.splitlines()[2].startswith("**Verdict:") and "![Speedup per class](plots/speedup.png)" in md


def test_rows_are_complete_and_unique(bench_run) -> None:
    rows = rows_of(bench_run.out)
    keys = [(r["request_id"], r["strategy"], r["repeat"]) for r in rows]
    assert len(keys) == len(set(keys)) == len(WORKLOAD) * len(STRATEGIES.split(",")) * REPEATS
    for r in rows:
        assert set(ROW_FIELDS) <= set(r)
        assert r["new_tokens"] >= 1 and r["steps"] >= 1 and r["total_s"] > 0 and r["device_s"] > 0
        assert r["processed_tokens"] >= r["new_tokens"] or r["strategy"].startswith("hf_")
        assert r["max_new_tokens"] == (12 if r["request_id"] == "code-2" else 16)
        assert r["new_tokens"] <= r["max_new_tokens"]
        assert r["dtype"] == "float32"  # every row says which dtype ran
        assert r["width_floor"] is None or r["strategy"].startswith("hf_") or r["width_floor"] >= 1
    # identity: engine rows are checked against autoregressive (sampled requests too, same seed);
    # transformers rows only on greedy requests; every checked row is identical.
    for r in rows:
        if r["strategy"] == "autoregressive" and r["repeat"] == 0:
            assert r["identical"] is None
        elif r["strategy"].startswith("hf_") and not r["greedy"]:
            assert r["identical"] is None
        else:
            assert r["identical"] is True, r
    sampled = [r for r in rows if r["class"] == "high_entropy" and r["strategy"] == "lookahead"]
    assert sampled and all(r["identical"] is True for r in sampled)


# ---- an independent recomputation of summary.json from results.jsonl ----

def records(rows: list[dict]) -> dict:
    groups = defaultdict(list)
    for r in rows:
        groups[(r["class"], r["strategy"], r["request_id"])].append(r)
    out: dict = defaultdict(dict)
    for (c, s, i), rs in groups.items():
        out[(c, s)][i] = {k: float(np.median([x[k] for x in rs])) for k in (
            "new_tokens", "steps", "guesses_verified", "guesses_accepted", "processed_tokens", "prefill_s",
            "decode_s", "total_s", "ttft_s", "device_s", "cached_tokens")}
    return out


def boot(values: list[float], fn, seed: int) -> list[float]:
    a = np.array(values)
    idx = np.random.default_rng(seed).integers(0, len(a), size=(RESAMPLES, len(a)))
    return list(np.percentile(fn(a[idx], axis=1), [2.5, 97.5]))


def close(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def test_summary_numbers_recomputed_from_rows(bench_run) -> None:
    rows = rows_of(bench_run.out)
    summary = json.loads((bench_run.out / "summary.json").read_text())
    recs = records(rows)
    assert summary["rows"] == len(rows) and summary["requests"] == len(WORKLOAD)
    assert set(summary["classes"]) == {"code", "chat", "high_entropy"}
    for cls, entry in summary["classes"].items():
        ar = recs[(cls, "autoregressive")]
        assert entry["requests"] == len(ar)
        for s, st in entry["strategies"].items():
            rr = recs[(cls, s)]
            v = list(rr.values())
            new = [x["new_tokens"] for x in v]
            assert st["n"] == len(v)
            assert close(st["new_tokens_mean"], float(np.mean(new)))
            assert close(st["new_tokens_median"], float(np.median(new)))
            ver = sum(x["guesses_verified"] for x in v)
            assert close(st["acceptance_rate"], sum(x["guesses_accepted"] for x in v) / ver if ver else None)
            assert close(st["tokens_per_step"], sum(new) / sum(x["steps"] for x in v))
            tot = [x["total_s"] for x in v]
            assert close(st["latency_p50_s"], float(np.percentile(tot, 50)))
            assert close(st["latency_p95_s"], float(np.percentile(tot, 95)))
            assert close(st["ttft_p50_s"], float(np.percentile([x["ttft_s"] for x in v], 50)))
            assert close(st["decode_tokens_per_s"], sum(new) / sum(x["decode_s"] for x in v))
            dev = float(np.mean([x["device_s"] for x in v]))
            assert close(st["device_s_per_request"], dev)
            assert close(st["cost_per_request_usd"], dev * PRICE / 3600)
            assert close(st["prefill_share"], sum(x["prefill_s"] for x in v) / sum(tot))
            assert close(st["cached_tokens_per_request"], float(np.mean([x["cached_tokens"] for x in v])))
            assert close(st["wasted_fraction"], max(0.0, 1 - sum(new) / sum(x["processed_tokens"] for x in v)))
            assert st["mismatches"] == 0
            if s == "autoregressive":
                assert "speedup_vs_ar" not in st
                continue
            ids = sorted(set(ar) & set(rr))
            ratios = [ar[i]["total_s"] / rr[i]["total_s"] for i in ids]
            saved = [ar[i]["device_s"] - rr[i]["device_s"] for i in ids]
            assert st["paired_n"] == len(ids)
            assert close(st["speedup_vs_ar"]["median"], float(np.median(ratios)))
            lo, hi = boot(ratios, np.median, 0)
            assert close(st["speedup_vs_ar"]["ci95"][0], lo) and close(st["speedup_vs_ar"]["ci95"][1], hi)
            assert lo <= st["speedup_vs_ar"]["median"] <= hi or len(ids) < 3
            assert close(st["device_s_saved_per_request"]["mean"], float(np.mean(saved)))
            lo, hi = boot(saved, np.mean, 1)
            assert close(st["device_s_saved_per_request"]["ci95"][0], lo)
            assert close(st["device_s_saved_per_request"]["ci95"][1], hi)
            assert close(st["processed_token_ratio_vs_ar"], sum(rr[i]["processed_tokens"] for i in ids)
                         / sum(ar[i]["processed_tokens"] for i in ids))
            assert close(st["cost_saved_per_request_usd"], float(np.mean(saved)) * PRICE / 3600)


def test_token_sources_recomputed_from_rows(bench_run) -> None:
    # Every engine row says which source each new token came from (the model's own token once per
    # step); the summary's shares and query tokens per step are the rows' sums, and the report shows them.
    rows = rows_of(bench_run.out)
    for r in rows:
        if r["strategy"].startswith("hf_"):
            assert r["accepted_by_source"] == {}
        else:
            assert sum(r["accepted_by_source"].values()) == r["new_tokens"], r
            assert r["accepted_by_source"]["model"] == r["steps"]
            if r["strategy"] == "autoregressive":
                assert set(r["accepted_by_source"]) == {"model"}
    summary = json.loads((bench_run.out / "summary.json").read_text())
    guessed = 0
    for cls, entry in summary["classes"].items():
        for s, st in entry["strategies"].items():
            mine = [r for r in rows if r["class"] == cls and r["strategy"] == s]
            assert st["query_tokens_per_step"] == pytest.approx(sum(r["processed_tokens"] for r in mine)
                                                                 / sum(r["steps"] for r in mine))
            counts: dict = defaultdict(int)
            for r in mine:
                for src, n in r["accepted_by_source"].items():
                    counts[src] += n
            total = sum(counts.values())
            assert st["accepted_share_by_source"] == pytest.approx({k: v / total for k, v in counts.items()} if total else {})
            guessed += s == "lookahead" and st["accepted_share_by_source"].get("model", 1.0) < 1.0
    assert guessed  # some guesses were accepted on the tiny model's repetitive prompts
    md = (bench_run.out / "report.md").read_text()
    assert "## Where the tokens come from" in md and "| class | strategy | tokens/step | query tokens/step |" in md


def test_mix_policy_and_crossover_recomputed(bench_run) -> None:
    summary = json.loads((bench_run.out / "summary.json").read_text())
    policy = json.loads((bench_run.out / "policy.json").read_text())
    assert summary["policy"] == policy
    classes = summary["classes"]
    # the workload's own class shares: 3 code, 2 chat, 2 high_entropy
    mix = summary["mix"]
    assert mix["shares"] == pytest.approx({"code": 3 / 7, "chat": 2 / 7, "high_entropy": 2 / 7})
    cost = {c: {s: st["cost_per_request_usd"] for s, st in e["strategies"].items()} for c, e in classes.items()}
    before = sum(mix["shares"][c] * cost[c]["autoregressive"] for c in cost)
    assert close(mix["before_usd"], before)
    for s in ("lookahead", "hf_generate", "hf_prompt_lookup"):
        after = sum(mix["shares"][c] * cost[c][s] for c in cost)
        assert close(mix["after"][s]["blended_cost_usd"], after)
        assert close(mix["after"][s]["saved_pct"], (before - after) / before * 100)
        wins = {c for c in cost if cost[c][s] < cost[c]["autoregressive"]}
        assert {p["class"] for p in mix["after"][s]["per_class"] if p["verdict"] == "wins"} == wins
    chosen = {c: d["strategy"] for c, d in policy["classes"].items()}
    assert close(mix["policy_usd"], sum(mix["shares"][c] * cost[c][chosen[c]] for c in cost))
    for c, d in policy["classes"].items():
        st = classes[c]["strategies"]["lookahead"]
        confident = st["device_s_saved_per_request"]["ci95"][0] > 0 and st["paired_n"] >= 5
        assert d["strategy"] == ("lookahead" if confident else "autoregressive")
        if d["strategy"] == "lookahead":
            assert d["lookahead"] == {"window": 4, "ngram": 4, "guesses": 4}
    assert policy["meta"]["model"] == summary["meta"]["model"] and "tiny-llama" in policy["meta"]["model"]
    # recorded (timings depend on it): the layers load() packs for this model in float32
    import lookahead

    assert summary["meta"]["packed_linears"] == lookahead.load(summary["meta"]["model"], dtype="float32",
                                                               probe=False).packed
    assert policy["meta"]["source"] == str(bench_run.out / "summary.json")
    # crossover: per-step cost ratio and break-even acceptance, from the per-request records
    recs = records(rows_of(bench_run.out))
    for c in classes:
        cr = classes[c]["crossover"]["lookahead"]
        ar = recs[(c, "autoregressive")]
        la = recs[(c, "lookahead")]
        t_ar = np.median([x["decode_s"] / x["steps"] for x in ar.values()])
        t_la = np.median([x["decode_s"] / x["steps"] for x in la.values()])
        assert close(cr["break_even_tokens_per_step"], float(t_la / t_ar))
        v = sum(x["guesses_verified"] for x in la.values()) / sum(x["steps"] for x in la.values())
        assert close(cr["break_even_acceptance_rate"], float((t_la / t_ar - 1) / v))
        fa, fl = cr["fit_ar"], cr["fit"]
        if cr["wins_for"] == "longer outputs":
            n = cr["break_even_new_tokens"]
            assert close(fa["fixed_s"] + fa["per_token_s"] * n, fl["fixed_s"] + fl["per_token_s"] * n)


def test_policy_is_readable_by_the_server(bench_run) -> None:
    from lookahead.policy import load_policy

    pol = load_policy(bench_run.out / "policy.json")
    written = json.loads((bench_run.out / "policy.json").read_text())
    for cls, d in written["classes"].items():
        strategy, _lk = pol.choose(cls, 10_000)
        assert strategy == d["strategy"]


def test_profile_in_report(bench_run) -> None:
    summary = json.loads((bench_run.out / "summary.json").read_text())
    prof = summary["profile"]
    assert [c["context"] for c in prof["contexts"]] == [32]
    ctx = prof["contexts"][0]
    t = {int(k): v for k, v in ctx["t_s"].items()}
    assert ctx["free_budget_tokens"] == max(k for k, v in t.items() if v <= 1.1 * t[1])
    share = summary["prefill_decode_share"]
    rows = rows_of(bench_run.out)
    p = sum(r["prefill_s"] for r in rows if r["class"] == "code" and r["strategy"] == "lookahead")
    d = sum(r["decode_s"] for r in rows if r["class"] == "code" and r["strategy"] == "lookahead")
    assert close(share["code"]["lookahead"], p / (p + d))
    assert "Serving-path profile" in (bench_run.out / "report.md").read_text()


def test_decision_table_recomputed(bench_run) -> None:
    """Three strategies compete with autoregressive here, so the run has a decision table: every cell,
    the fastest and cheapest strategy, and lookahead's head-to-head ratios, recomputed from the rows."""
    summary = json.loads((bench_run.out / "summary.json").read_text())
    doc = summary["decision"]
    assert doc["primary"] == "lookahead" and doc["strategies"] == STRATEGIES.split(",")
    recs = records(rows_of(bench_run.out))
    for cls, c in doc["classes"].items():
        ar = recs[(cls, "autoregressive")]
        speed = {"autoregressive": 1.0}
        for s in ("lookahead", "hf_generate", "hf_prompt_lookup"):
            ids = sorted(set(ar) & set(recs[(cls, s)]))
            speed[s] = float(np.median([ar[i]["total_s"] / recs[(cls, s)][i]["total_s"] for i in ids]))
        assert c["speedup_vs_ar"] == pytest.approx(speed, rel=1e-12)
        device = {s: float(np.mean([x["device_s"] for x in recs[(cls, s)].values()])) for s in speed}
        assert c["device_s_per_request"] == pytest.approx(device, rel=1e-12)  # every strategy ran every request
        # eligible: autoregressive, and strategies whose every row was checked and identical (the
        # transformers rows of sampled requests are unchecked, so not eligible on high_entropy)
        rows = [r for r in rows_of(bench_run.out) if r["class"] == cls]
        eligible = [s for s in speed if s == "autoregressive"
                    or all(r["identical"] is True for r in rows if r["strategy"] == s)]
        assert ("hf_generate" in eligible) == (cls != "high_entropy")
        assert c["fastest"] == max(eligible, key=speed.get)
        assert c["cheapest"] == min(eligible, key=device.get)
        la = recs[(cls, "lookahead")]
        for rival in ("hf_generate", "hf_prompt_lookup"):
            rr = recs[(cls, rival)]
            ids = sorted(set(la) & set(rr))
            ratios = [rr[i]["total_s"] / la[i]["total_s"] for i in ids]  # > 1: lookahead ran faster
            h = c["primary_vs"][rival]
            assert h["paired_n"] == len(ids)
            assert close(h["median"], float(np.median(ratios)))
            lo, hi = boot(ratios, np.median, 0)
            assert close(h["ci95"][0], lo) and close(h["ci95"][1], hi)
    report = (bench_run.out / "report.md").read_text()
    assert "## Decision table" in report and "lookahead vs hf_prompt_lookup" in report


def test_no_decision_table_for_one_strategy() -> None:
    """autoregressive against a single strategy is the plain per-class report: no decision table."""
    from lookahead.bench.compare import decision_table

    assert decision_table({}, {}, ["autoregressive", "lookahead"], resamples=10) is None
