"""Shared fixtures: a tiny random model saved as a HF folder, and one benchmark run on it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.bench.bench_helpers import WORKLOAD, CliResult, bench_argv, run_cli, write_workload


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny test model written as a Hugging Face folder, so `--model DIR` loads it like any model."""
    from lookahead.testing import tiny_model

    loaded = tiny_model("llama", seed=0)
    d = tmp_path_factory.mktemp("tiny-llama")
    loaded.model.save_pretrained(d)
    loaded.tokenizer.save_pretrained(d)
    return d


@dataclass
class BenchRun:
    out: Path
    workload: Path
    result: CliResult


@pytest.fixture(scope="session")
def bench_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> BenchRun:
    """One full benchmark: 7 requests x 4 strategies x 2 repeats, with a small serving-path profile."""
    base = tmp_path_factory.mktemp("bench")
    wl = write_workload(base / "workload.jsonl", WORKLOAD)
    out = base / "out"
    res = run_cli(bench_argv(tiny_model_dir, wl, out, "--repeats", "2", "--price-per-hour", "2.5",
                             "--profile-contexts", "32"))
    return BenchRun(out, wl, res)
