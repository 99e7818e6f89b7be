"""`lookahead profile`: t(k) over cached contexts, the free verification budget, W,N,G that fit it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.bench.bench_helpers import run_cli

from lookahead.bench.profile import budget, fitting_configs, recommend
from lookahead.config import LookaheadConfig


def test_budget_and_fitting_configs() -> None:
    times = {1: 10.0, 2: 10.5, 4: 10.9, 8: 11.5, 16: 10.8, 32: 20.0}
    assert budget(times) == 16  # largest k within 1.1 x t(1), even past a noisy bump
    assert budget({1: 1.0, 2: 5.0}) == 1
    for free in (1, 2, 7, 13, 25, 64):
        configs = fitting_configs(free)
        for c in configs:
            # the profile's shapes verify N-1-token candidates (context_tokens=None)
            q = LookaheadConfig(window=c["window"], ngram=c["ngram"], guesses=c["guesses"], context_tokens=None).query_tokens
            assert q == c["query_tokens"] <= free
            bigger = LookaheadConfig(window=c["window"] + 1, ngram=c["ngram"], guesses=c["guesses"] + 1, context_tokens=None)
            assert bigger.query_tokens > free  # the largest symmetric W = G for that N
    assert fitting_configs(2) == [] and recommend([]) is None
    assert recommend(fitting_configs(25)) == {"window": 4, "ngram": 4, "guesses": 4, "query_tokens": 25}
    assert recommend(fitting_configs(5))["ngram"] == 3


def test_profile_command_on_tiny_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "prof"
    res = run_cli(["profile", "--model", str(tiny_model_dir), "--context", "16,64,2000", "--k", "1,2,4,8",
                   "--repeats", "2", "--out", str(out)])
    assert res.rc == 0, res.err
    doc = json.loads((out / "profile.json").read_text())
    assert (out / "profile.png").stat().st_size > 1000
    assert [c["context"] for c in doc["contexts"]] == [16, 64]
    assert doc["skipped"][0]["context"] == 2000 and "exceeds the model's 1024 tokens" in doc["skipped"][0]["reason"]
    for c in doc["contexts"]:
        t = {int(k): v for k, v in c["t_s"].items()}
        assert sorted(t) == [1, 2, 4, 8] and all(v > 0 for v in t.values())
        assert c["free_budget_tokens"] == max(k for k, v in t.items() if v <= 1.1 * t[1])
        assert c["recommended"] == recommend(fitting_configs(c["free_budget_tokens"]))
    line = res.json_line()
    assert set(line["budget"]) == {"16", "64"}
    assert "skipped" in res.out
    # the engine's own curve (what the allocator reads), re-timed through its model runner and cached
    curve = doc["cost_curve"]
    assert curve["1"] == 1.0 and {"2", "8", "32"} <= set(curve) and all(v > 0 for v in curve.values())
    assert "engine cost curve" in res.out


@pytest.mark.parametrize("argv, message", [
    (["--context", "abc"], "--context takes integers >= 1"),
    (["--k", "0,4"], "--k takes integers >= 1"),
    (["--repeats", "0"], "--repeats must be >= 1"),
])
def test_profile_bad_input(tiny_model_dir: Path, tmp_path: Path, argv: list[str], message: str) -> None:
    res = run_cli(["profile", "--model", str(tiny_model_dir), "--out", str(tmp_path), *argv])
    assert res.rc == 2 and message in res.err and res.err.startswith("error: ")
