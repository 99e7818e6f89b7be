"""CLI options of the prompt_lookup and speculative strategies and of the cross-request n-gram cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lookahead.cli.main import main

TINY = ["--model", "tiny:llama"]


@pytest.mark.parametrize("argv, needle", [
    (["generate", "hi", *TINY, "--strategy", "speculative", "--draft", "self:0"], "self:L"),
    (["generate", "hi", *TINY, "--strategy", "speculative", "--draft", "self:7"], "target has 2"),
    (["generate", "hi", *TINY, "--strategy", "speculative", "--draft-tokens", "0"], "draft_tokens"),
    (["generate", "hi", *TINY, "--strategy", "speculative", "--draft", "no-such-model"], "no model at"),
    (["generate", "hi", "--model", "tiny:gpt2", "--strategy", "speculative"], "self-drafting supports"),
    (["generate", "hi", *TINY, "--strategy", "prompt_lookup", "--lookup-min-ngram", "4"], "min_ngram"),
    (["generate", "hi", *TINY, "--strategy", "prompt_lookup", "--lookup-tokens", "0"], "num_tokens"),
])
def test_bad_strategy_options_exit_2_with_a_message(argv: list[str], needle: str, capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("strategy, extra", [
    ("speculative", ["--draft", "self:1", "--draft-tokens", "2"]),
    ("prompt_lookup", ["--lookup-min-ngram", "2", "--lookup-tokens", "3", "--lookup-candidates", "2"]),
    ("lookahead_jacobi", []),
])
def test_compare_runs_the_chosen_strategy(strategy: str, extra: list[str], capsys) -> None:
    argv = ["generate", "abcabcabcabc", *TINY, "--raw", "--compare", "--json", "--max-new-tokens", "16",
            "--strategy", strategy, *extra]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["identical"] is True and out[strategy]["strategy"] == strategy
    stats = out[strategy]["stats"]
    assert (stats["draft_steps"] > 0) == (strategy == "speculative")
    assert stats["device_s"] >= stats["draft_s"]


def test_ngram_cache_file_is_created_then_used(tmp_path: Path, capsys) -> None:
    path = tmp_path / "ngrams.json"
    argv = ["generate", "Dear Sir, please", *TINY, "--raw", "--json", "--max-new-tokens", "30",
            "--strategy", "prompt_lookup", "--ngram-cache", str(path), "--no-adaptive"]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert path.is_file()
    assert main(argv) == 0
    second = json.loads(capsys.readouterr().out)
    assert second["token_ids"] == first["token_ids"]
    assert second["stats"]["accepted_by_source"].get("cache", 0) > 0
    path.write_text("{broken")
    assert main(argv) == 2
    assert "cannot read n-gram cache file" in capsys.readouterr().err
