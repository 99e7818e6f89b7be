"""Unit tests of the statistics, crossover, mix and policy formulas on synthetic records."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lookahead.bench.config import BenchConfig, parse_mix, parse_wng
from lookahead.bench.economics import _break_even_share, blend, cost_model, crossover, linear_fit
from lookahead.bench.policy import build_policy
from lookahead.bench.stats import bootstrap_ci, percentile
from lookahead.config import LookaheadConfig
from lookahead.errors import ConfigError


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=50), st.floats(0, 100))
def test_percentile_matches_numpy(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-9, abs=1e-6)


def test_bootstrap_interval() -> None:
    assert bootstrap_ci([2.0], np.median, resamples=200, seed=0) == [2.0, 2.0]
    vals = list(np.random.default_rng(5).normal(1.5, 0.1, size=200))
    lo, hi = bootstrap_ci(vals, np.median, resamples=1000, seed=0)
    assert lo < float(np.median(vals)) < hi and hi - lo < 0.1
    assert bootstrap_ci(vals, np.mean, resamples=1000, seed=3) == bootstrap_ci(vals, np.mean, resamples=1000, seed=3)


def rec(n: float, device: float, prefill: float = 0.1, steps: float | None = None, verified: float = 0.0,
        accepted: float = 0.0) -> dict:
    steps = n if steps is None else steps
    return {"new_tokens": n, "device_s": device, "prefill_s": prefill, "decode_s": device - prefill, "steps": steps,
            "guesses_verified": verified, "guesses_accepted": accepted, "total_s": device, "processed_tokens": n}


def test_linear_fit_and_cost_model() -> None:
    assert linear_fit([1, 2, 3], [3, 5, 7]) == pytest.approx((1.0, 2.0))
    assert linear_fit([4, 4], [1, 2]) is None
    (a, b), how = cost_model([rec(n, 0.5 + 0.01 * n) for n in (10, 50, 100)])
    assert how == "least squares" and (a, b) == pytest.approx((0.5, 0.01))
    (a, b), how = cost_model([rec(64, 1.0, prefill=0.2), rec(64, 1.4, prefill=0.4)])  # all hit the limit
    assert how == "prefill + per-token cost" and a == pytest.approx(0.3) and b == pytest.approx((0.8 + 1.0) / 128)


def test_crossover_break_even_length_and_acceptance() -> None:
    # AR: 0.1 + 0.010 s/token; other: 0.5 + 0.006 s/token -> equal at n* = 0.4 / 0.004 = 100 tokens
    lengths = (20, 60, 120, 200)
    base = {str(n): rec(n, 0.1 + 0.010 * n) for n in lengths}
    other = {str(n): rec(n, 0.5 + 0.006 * n, steps=n / 2, verified=n * 2, accepted=n / 2) for n in lengths}
    c = crossover(base, other)
    assert c["wins_for"] == "longer outputs" and c["break_even_new_tokens"] == pytest.approx(100.0)
    # step costs: AR decode (0.01n)/n ... other (0.4 + 0.006n)/(n/2); ratio r, break-even acceptance (r-1)/v, v = 4
    t_ar = np.median([(0.010 * n) / n for n in lengths])
    t_o = np.median([(0.4 + 0.006 * n) / (n / 2) for n in lengths])
    assert c["break_even_tokens_per_step"] == pytest.approx(t_o / t_ar)
    assert c["break_even_acceptance_rate"] == pytest.approx((t_o / t_ar - 1) / 4)
    assert c["observed_acceptance_rate"] == pytest.approx(0.25) and c["observed_tokens_per_step"] == pytest.approx(2.0)
    worse = {str(n): rec(n, 0.05 + 0.02 * n) for n in lengths}
    assert crossover(base, worse)["wins_for"] == "shorter outputs"


def test_break_even_share() -> None:
    win = [{"share": 0.2, "saved_usd": 3.0}]
    lose = [{"share": 0.8, "saved_usd": -1.0}]
    s = _break_even_share(win, lose)  # s*3 + (1-s)*(-1) = 0 -> s = 0.25
    assert s == pytest.approx(0.25)
    assert _break_even_share(win, []) == 0.0 and _break_even_share([], lose) is None


def table(saved_mean: float, lo: float, n: int = 30) -> dict:
    base = {"cost_per_request_usd": 1.0}
    return {"strategies": {"autoregressive": base, "lookahead": {
        "cost_per_request_usd": 1.0 - saved_mean, "paired_n": n,
        "device_s_saved_per_request": {"mean": saved_mean, "ci95": [lo, 1.0]}}}}


def test_policy_needs_a_confident_saving_and_adds_length_rules() -> None:
    classes = {"code": table(0.4, 0.1), "chat": table(0.1, -0.05), "sum": table(0.3, 0.2)}
    cross = {"code": {"lookahead": {"break_even_new_tokens": 37.2, "wins_for": "longer outputs"}},
             "sum": {"lookahead": {"break_even_new_tokens": 0.0, "wins_for": "always"}}}
    lk = LookaheadConfig(window=6, ngram=3, guesses=5)
    pol = build_policy(classes, cross, ("autoregressive", "lookahead", "hf_generate"), lk, {"model": "m"})
    assert pol["classes"]["code"] == {"strategy": "lookahead", "lookahead": {"window": 6, "ngram": 3, "guesses": 5}}
    assert pol["classes"]["chat"] == {"strategy": "autoregressive"}
    assert pol["default"] == {"strategy": "autoregressive"}  # the classes disagree
    assert pol["rules"] == [{"if": {"class": "code", "max_tokens_below": 38}, "strategy": "autoregressive"}]
    assert pol["meta"]["model"] == "m" and "lower bound" in pol["meta"]["reasons"]["chat"]
    mix = blend(classes, {"code": 0.5, "chat": 0.25, "sum": 0.25}, ("autoregressive", "lookahead"),
                {c: d["strategy"] for c, d in pol["classes"].items()})
    assert mix["before_usd"] == pytest.approx(1.0)
    assert mix["after"]["lookahead"]["blended_cost_usd"] == pytest.approx(1 - (0.5 * 0.4 + 0.25 * 0.1 + 0.25 * 0.3))
    assert mix["policy_usd"] == pytest.approx(1 - (0.5 * 0.4 + 0.25 * 0.3))
    unanimous = build_policy({"code": table(0.4, 0.1)}, {}, ("autoregressive", "lookahead"), lk, {})
    assert unanimous["default"]["strategy"] == "lookahead"
    few = build_policy({"code": table(0.4, 0.1, n=4)}, {}, ("autoregressive", "lookahead"), lk, {})
    assert few["classes"]["code"]["strategy"] == "autoregressive" and "too few" in few["meta"]["reasons"]["code"]
    # a confident saving over too few requests: the reason does not claim the interval reaches 0
    assert "<= 0" not in few["meta"]["reasons"]["code"] and "at least 5 requests" in few["meta"]["reasons"]["code"]


def test_config_parsing_at_the_edge(tmp_path) -> None:
    assert parse_wng("8, 4, 2") == LookaheadConfig(window=8, ngram=4, guesses=2)
    assert parse_mix("code=1,chat=3") == {"code": 0.25, "chat": 0.75}
    with pytest.raises(ConfigError, match="add up to 0"):
        parse_mix("code=0")
    kw = dict(model="m", workloads=("w",), out=tmp_path, known_strategies=("autoregressive", "lookahead"))
    with pytest.raises(ConfigError, match="twice"):
        BenchConfig(strategies=("autoregressive", "lookahead", "lookahead"), **kw)
    with pytest.raises(ConfigError, match="--price-per-hour"):
        BenchConfig(strategies=("autoregressive", "lookahead"), price_per_hour=-1, **kw)


def test_transformers_rows_ignore_the_models_generation_defaults() -> None:
    """A generation_config.json with a repetition penalty must not change the greedy reference rows."""
    from lookahead.bench.runners import RunSpec, engine_runner, hf_runner
    from lookahead.config import SamplingConfig
    from lookahead.testing import tiny_model

    m = tiny_model("llama", seed=0)
    m.model.generation_config.repetition_penalty = 1.3
    m.model.generation_config.no_repeat_ngram_size = 2
    ids = m.encode("hello hello hello")
    spec = RunSpec(24, SamplingConfig(), LookaheadConfig())
    ar = engine_runner("autoregressive")(m, ids, spec)
    plain, lookup = hf_runner(False)(m, ids, spec), hf_runner(True)(m, ids, spec)
    assert plain.token_ids == lookup.token_ids == ar.token_ids
    assert plain.steps == plain.new_tokens == plain.processed_tokens and plain.guesses_verified == 0
    assert lookup.steps <= lookup.new_tokens and lookup.guesses_accepted == lookup.new_tokens - lookup.steps
    assert lookup.processed_tokens == lookup.steps + lookup.guesses_verified
    assert 0 < plain.prefill_s <= plain.ttft_s <= plain.total_s and plain.device_s <= plain.total_s


def test_decision_table_hand_case() -> None:
    """Two requests of one class. Per request latencies (seconds):

        autoregressive  2.0  4.0
        lookahead       1.0  2.5   -> speedups 2.0, 1.6: median 1.8
        prompt_lookup   0.5  1.0   -> speedups 4.0, 4.0, but one output differs from autoregressive

    prompt_lookup is faster and cheaper, but not lossless, so lookahead is the fastest and cheapest
    strategy that may be chosen. Head to head, lookahead's latency ratios are 0.5/1.0 and 1.0/2.5:
    median 0.45 (it is slower than prompt_lookup).
    """
    from lookahead.bench.compare import decision_table
    from lookahead.bench.stats import class_tables

    def full(total: float, mismatch: bool = False) -> dict:
        r = {k: 1.0 for k in ("prompt_tokens", "new_tokens", "steps", "guesses_verified", "guesses_accepted",
                              "processed_tokens", "prefill_s", "decode_s", "ttft_s", "cpu_s")}
        return {**r, "total_s": total, "device_s": total, "repeats": 1, "checked": 1, "mismatches": int(mismatch)}

    records = {("code", "autoregressive"): {"a": full(2.0), "b": full(4.0)},
               ("code", "lookahead"): {"a": full(1.0), "b": full(2.5)},
               ("code", "prompt_lookup"): {"a": full(0.5), "b": full(1.0, mismatch=True)}}
    strategies = ["autoregressive", "lookahead", "prompt_lookup"]
    classes = class_tables(records, strategies, price_per_hour=1.0, resamples=50)
    doc = decision_table(records, classes, strategies, resamples=50)
    assert doc is not None and doc["primary"] == "lookahead"
    c = doc["classes"]["code"]
    assert c["speedup_vs_ar"] == pytest.approx({"autoregressive": 1.0, "lookahead": 1.8, "prompt_lookup": 4.0})
    assert c["device_s_per_request"] == pytest.approx({"autoregressive": 3.0, "lookahead": 1.75, "prompt_lookup": 0.75})
    assert (c["fastest"], c["cheapest"]) == ("lookahead", "lookahead")
    assert c["primary_vs"]["prompt_lookup"]["median"] == pytest.approx(0.45)
    assert c["primary_vs"]["prompt_lookup"]["paired_n"] == 2


def test_the_engine_runner_keeps_what_a_class_learned_per_class_and_repeat(monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests of one class, in one repeat, share a calibrator and recycled successors; another class or
    another repeat does not (a repeat must not start from its own request's first answer)."""
    import lookahead
    from lookahead.bench.runners import RunSpec, engine_runner
    from lookahead.config import SamplingConfig
    from lookahead.testing import tiny_model

    real, seen = lookahead.generate, []

    def spy(*args: object, **kwargs: object) -> object:
        seen.append((kwargs["calibrator"], kwargs["successors"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(lookahead, "generate", spy)
    m = tiny_model("llama", seed=0)
    ids = m.encode("hello hello hello")
    run = engine_runner("lookahead")
    for cls, rep in [("code", 0), ("code", 0), ("chat", 0), ("code", 1)]:
        run(m, ids, RunSpec(8, SamplingConfig(), LookaheadConfig(), request_class=cls, repeat=rep))
    (cal0, suc0), (cal1, suc1), (cal2, suc2), (cal3, suc3) = seen
    assert cal0 is cal1 and suc0 is suc1 and len(suc0)  # the second code request starts from the first's
    assert cal2 is not cal0 and suc2 is not suc0  # another class
    assert cal3 is not cal0 and suc3 is not suc0  # another repeat


def test_the_engine_runner_keeps_one_prefix_cache_per_repeat_and_none_for_whole() -> None:
    """Every runner (strategy) keeps its own prefix cache across classes, one per repeat: so each strategy
    finds the prompts it prefilled itself in this pass, never another strategy's or its own from an earlier
    repeat; a /whole label prefills every prompt whole."""
    import torch

    from lookahead.bench.runners import RunSpec, engine_runner
    from lookahead.config import SamplingConfig
    from lookahead.testing import tiny_model

    m = tiny_model("llama", dtype=torch.bfloat16, seed=0)  # the prefill kernel: prompts split exactly
    head = "You are a careful assistant. Answer in one line, in English, and never guess. "
    a, b = m.encode(head + "Q: 2+2?", raw=True), m.encode(head + "Q: capital of France?", raw=True)

    def cached(label: str, runs: list[tuple[list[int], str, int]]) -> list[int]:
        run = engine_runner(label)
        return [run(m, ids, RunSpec(4, SamplingConfig(), LookaheadConfig(), request_class=cls, repeat=rep)).cached_tokens
                for ids, cls, rep in runs]

    # b after a (another class, same repeat) reuses the shared head; a again in repeat 1 finds nothing
    got = cached("autoregressive", [(a, "code", 0), (b, "chat", 0), (a, "code", 1)])
    common = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)  # the shared head's tokens (and "Q: ")
    assert got[0] == 0 and got[1] == common // 16 * 16 >= 64 and got[2] == 0
    assert cached("lookahead", [(a, "code", 0)]) == [0]  # a new runner (strategy) starts empty
    assert cached("autoregressive/whole", [(a, "code", 0), (a, "code", 0)]) == [0, 0]
