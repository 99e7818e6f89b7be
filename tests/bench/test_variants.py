"""Strategy labels with parameters (`--strategies speculative/draft=self:24/k=4,...`): hand-written
cases, each with the reading it must get, and the errors that tell the user what to write."""

from __future__ import annotations

import pytest

from lookahead.bench.policy import build_policy, decision
from lookahead.bench.variants import parse_strategy
from lookahead.config import STRATEGIES, LookaheadConfig, PromptLookupConfig, SpeculativeConfig
from lookahead.errors import ConfigError
from lookahead.policy import Policy

KNOWN = tuple(STRATEGIES) + ("hf_generate", "hf_prompt_lookup")
RUN_SHAPE = LookaheadConfig(window=3, ngram=4, guesses=5)  # stands in for the run's --lookahead


def test_a_bare_name_has_no_parameters_and_takes_the_runs_shape() -> None:
    v = parse_strategy("lookahead", KNOWN)
    assert (v.strategy, v.config, v.lookahead_overrides, v.ngram_cache) == ("lookahead", None, (), False)
    assert v.lookahead_or(RUN_SHAPE) == RUN_SHAPE


def test_lookahead_shape_in_short_and_long_keys() -> None:
    # W/N/G and window/ngram/guesses are the same fields; the ones a label leaves out come from the
    # run's --lookahead shape (here W3 N4 G5), not from LookaheadConfig's defaults.
    short = parse_strategy("lookahead_jacobi/W=4/N=5/G=2", KNOWN)
    long = parse_strategy("lookahead_jacobi/window=4/ngram=5/guesses=2", KNOWN)
    assert short.lookahead_or(RUN_SHAPE) == long.lookahead_or(RUN_SHAPE) == LookaheadConfig(window=4, ngram=5, guesses=2)
    assert parse_strategy("lookahead/G=0", KNOWN).lookahead_or(RUN_SHAPE) == LookaheadConfig(window=3, ngram=4, guesses=0)
    # context_tokens lengthens context/cache candidates only; the policy entry carries it (a non-default knob)
    longer = parse_strategy("lookahead/context_tokens=8/cache", KNOWN)
    assert longer.lookahead_or(RUN_SHAPE) == LookaheadConfig(window=3, ngram=4, guesses=5, context_tokens=8)
    assert decision("lookahead/context_tokens=8/cache", RUN_SHAPE)["lookahead"] == {
        "window": 3, "ngram": 4, "guesses": 5, "context_tokens": 8}


def test_lookahead_sources_by_name_joined_with_plus() -> None:
    # A source set is one value: names from the registry joined by '+', in the order given (the pool asks
    # them in that order); the rest of the shape still comes from the run (W3 N4 G5).
    v = parse_strategy("lookahead/sources=suffix+recycle/G=2", KNOWN)
    assert v.lookahead_or(RUN_SHAPE) == LookaheadConfig(window=3, ngram=4, guesses=2, sources=("suffix", "recycle"))
    # The policy entry carries it, and the server reads it back as the same config.
    doc = decision("lookahead/sources=suffix+recycle", RUN_SHAPE)
    assert doc["lookahead"]["sources"] == ["suffix", "recycle"]
    assert Policy.from_dict({"version": 1, "default": doc}).default.config.sources == ("suffix", "recycle")
    with pytest.raises(ConfigError, match="unknown: drafts"):
        parse_strategy("lookahead/sources=suffix+drafts", KNOWN)
    with pytest.raises(ConfigError, match="names joined by '\\+'"):
        parse_strategy("lookahead/sources=+", KNOWN)


def test_cache_flag_on_lookahead_and_prompt_lookup_only() -> None:
    assert parse_strategy("lookahead/cache", KNOWN).ngram_cache
    pl = parse_strategy("prompt_lookup/max_ngram=4/num_tokens=10/cache", KNOWN)
    assert pl.ngram_cache and pl.config == PromptLookupConfig(max_ngram=4, num_tokens=10)
    with pytest.raises(ConfigError, match="offered to lookahead and prompt_lookup only"):
        parse_strategy("speculative/cache", KNOWN)


def test_speculative_self_draft_and_k() -> None:
    # The draft value keeps its colon ("self:24"); k is draft_tokens.
    v = parse_strategy("speculative/draft=self:24/k=3", KNOWN)
    assert v.config == SpeculativeConfig(draft="self:24", draft_tokens=3)
    # No parameters: SpeculativeConfig's defaults (half the layers, k=4).
    assert parse_strategy("speculative", KNOWN).config == SpeculativeConfig()
    # A draft named by a Hugging Face id or a path keeps its slashes; the next key=value still parses.
    hub = parse_strategy("speculative/draft=HuggingFaceTB/SmolLM2-135M/k=2", KNOWN)
    assert hub.config == SpeculativeConfig(draft="HuggingFaceTB/SmolLM2-135M", draft_tokens=2)
    path = parse_strategy("speculative/draft=/models/draft.gguf", KNOWN)
    assert path.config == SpeculativeConfig(draft="/models/draft.gguf")


@pytest.mark.parametrize(
    ("label", "message"),
    [
        ("jacobi", "unknown strategy jacobi; choose from"),
        ("autoregressive/W=2", "takes no parameters"),
        ("hf_generate/cache", "offered to lookahead and prompt_lookup only"),
        ("lookahead/X=2", "lookahead takes W=..., N=..., G=..."),
        ("lookahead/W", "cannot read 'W'"),
        ("lookahead/W=two", "W takes an integer"),
        ("prompt_lookup/min_ngram=4/max_ngram=2", "must be <= max_ngram"),  # the config's own check
        ("speculative/draft=self:0", "self:L with L >= 1"),
    ],
)
def test_bad_labels_say_what_to_write(label: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_strategy(label, KNOWN)


def test_cache_strategies_refuse_repeats(tmp_path) -> None:
    # Repeat 2 of a request would find repeat 1's output in the cache: a measurement of a lookup.
    from lookahead.bench.config import BenchConfig

    args = dict(model="m", workloads=("w",), out=tmp_path, known_strategies=KNOWN)
    BenchConfig(strategies=("autoregressive", "lookahead/cache"), repeats=1, **args)
    BenchConfig(strategies=("autoregressive", "lookahead"), repeats=3, **args)
    with pytest.raises(ConfigError, match="lookahead/cache: .* --repeats 1"):
        BenchConfig(strategies=("autoregressive", "lookahead/cache"), repeats=2, **args)


def test_policy_entries_come_back_in_the_servers_format() -> None:
    # The cache flag is a deployment choice, so the policy entry of "lookahead/W=4/cache" is plain lookahead.
    assert decision("lookahead/W=4/cache", RUN_SHAPE) == {
        "strategy": "lookahead", "lookahead": {"window": 4, "ngram": 4, "guesses": 5}}
    assert decision("lookahead", RUN_SHAPE)["lookahead"] == {"window": 3, "ngram": 4, "guesses": 5}
    spec = decision("speculative/draft=self:24/k=3", RUN_SHAPE)
    assert spec == {"strategy": "speculative", "speculative": {"draft": "self:24", "draft_tokens": 3}}


def test_build_policy_records_the_measured_label_and_the_server_reads_it() -> None:
    saving = {"device_s_saved_per_request": {"mean": 1.0, "ci95": [0.5, 1.5]}, "paired_n": 10}
    small = {"device_s_saved_per_request": {"mean": 0.2, "ci95": [0.1, 0.3]}, "paired_n": 10}
    classes = {"code": {"strategies": {"prompt_lookup/num_tokens=10": saving, "lookahead": small}}}
    doc = build_policy(classes, {}, ["autoregressive", "lookahead", "prompt_lookup/num_tokens=10"], RUN_SHAPE, {})
    # The larger confident saving wins; the label that measured it is kept for the report's mix.
    assert doc["meta"]["measured_as"] == {"code": "prompt_lookup/num_tokens=10"}
    policy = Policy.from_dict(doc)
    assert policy.classes["code"].config == PromptLookupConfig(num_tokens=10)
    assert policy.default.strategy == "prompt_lookup"  # the only measured class agrees on it


def test_a_decision_table_run_measures_every_variant_losslessly(tiny_model_dir, tmp_path) -> None:
    # The decision table of issue 4 in miniature: every engine strategy, some with parameters, in one
    # run on the tiny model. Every output must equal autoregressive decoding's; the speculative rows
    # carry the draft's own cost; the cached rows report the cache's memory once it has seen a response.
    import json

    from tests.bench.bench_helpers import WORKLOAD, bench_argv, run_cli, write_workload

    labels = ("autoregressive,lookahead_jacobi,lookahead/W=2/N=3/G=2,lookahead/cache,"
              "prompt_lookup/max_ngram=2/num_tokens=4/cache,speculative/draft=self:1/k=2")
    wl = write_workload(tmp_path / "w.jsonl", WORKLOAD)
    out = tmp_path / "out"
    argv = bench_argv(tiny_model_dir, wl, out, "--profile-contexts", "none", "--no-warmup",
                      "--max-new-tokens", "24", strategies=labels)
    result = run_cli(argv)
    assert result.rc == 0, result.err
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    by_label: dict[str, list[dict]] = {}
    for r in rows:
        by_label.setdefault(r["strategy"], []).append(r)
    assert set(by_label) == set(labels.split(","))
    assert all(r["identical"] is True for r in rows if r["strategy"] != "autoregressive")
    assert all(r["draft_steps"] > 0 and 0 < r["draft_s"] <= r["device_s"]
               for r in by_label["speculative/draft=self:1/k=2"])
    assert all(r["draft_steps"] == 0 for r in by_label["lookahead/cache"])
    code_cache = [r["ngram_cache_bytes"] for r in by_label["lookahead/cache"] if r["class"] == "code"]
    assert code_cache[0] > 0 and code_cache == sorted(code_cache)  # warmed by each finished response
    assert all(r["ngram_cache_bytes"] == 0 for r in by_label["lookahead_jacobi"])
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["classes"]["code"]["strategies"]) == set(labels.split(","))


def test_cached_winners_tell_the_operator_to_serve_with_the_cache() -> None:
    # code wins with lookahead/cache, json with plain lookahead: the same policy decision, so the
    # default agrees with them; the cache requirement for code is recorded with the command to use.
    saving = {"device_s_saved_per_request": {"mean": 1.0, "ci95": [0.5, 1.5]}, "paired_n": 10}
    classes = {"code": {"strategies": {"lookahead/cache": saving}}, "json": {"strategies": {"lookahead": saving}}}
    doc = build_policy(classes, {}, ["autoregressive", "lookahead", "lookahead/cache"], RUN_SHAPE, {})
    assert doc["classes"]["code"] == doc["classes"]["json"] == doc["default"]
    assert doc["default"]["strategy"] == "lookahead"
    assert doc["meta"]["ngram_cache_classes"] == ["code"]
    assert doc["meta"]["serve_with"].endswith("--ngram-cache code")
    Policy.from_dict(doc)  # and the server still reads it


def test_unpadded_flag_runs_an_engine_strategy_without_the_width_floor() -> None:
    # /unpadded combines with parameters and /cache in any order; it is not a parameter of the config
    v = parse_strategy("lookahead/unpadded/W=2/cache", KNOWN)
    assert (v.exact, v.ngram_cache, v.lookahead_or(RUN_SHAPE).window) == (False, True, 2)
    assert parse_strategy("autoregressive/unpadded", KNOWN).exact is False
    assert parse_strategy("autoregressive", KNOWN).exact is True


def test_unpadded_is_refused_on_transformers_rows() -> None:
    with pytest.raises(ConfigError, match="applies to the engine's strategies"):
        parse_strategy("hf_generate/unpadded", KNOWN)


def test_whole_flag_prefills_every_prompt_whole() -> None:
    # /whole (no prefix cache) combines with parameters and the other flags; transformers' rows refuse it
    v = parse_strategy("lookahead/whole/W=2/unpadded", KNOWN)
    assert (v.prefix_cache, v.exact, v.lookahead_or(RUN_SHAPE).window) == (False, False, 2)
    assert parse_strategy("autoregressive", KNOWN).prefix_cache is True
    assert parse_strategy("prompt_lookup/whole/cache", KNOWN).prefix_cache is False
    with pytest.raises(ConfigError, match="applies to the engine's strategies"):
        parse_strategy("hf_generate/whole", KNOWN)
