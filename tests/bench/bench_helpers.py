"""Helpers shared by the benchmark tests (imported by conftest.py and the test modules)."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from dataclasses import dataclass
from pathlib import Path

STRATEGIES = "autoregressive,lookahead,hf_generate,hf_prompt_lookup"

WORKLOAD = [
    {"id": "code-1", "class": "code", "messages": [{"role": "user", "content": "def add(a, b):\n    return a + b\n\ndef add3(a, b, c):"}]},
    {"id": "code-2", "class": "code", "messages": [{"role": "user", "content": "for i in range(3):\n    print(i)\nfor i in range(3):"}],
     "max_tokens": 12, "meta": {"note": "has its own max_tokens"}},
    {"id": "code-3", "class": "code", "messages": [{"role": "user", "content": "x = [1, 2, 3]\ny = [1, 2, 3]\nz = [1, 2,"}]},
    {"id": "chat-1", "class": "chat", "messages": [{"role": "system", "content": "Be brief."},
                                                   {"role": "user", "content": "Tell me about the sea and the sea."}]},
    {"id": "chat-2", "class": "chat", "messages": [{"role": "user", "content": "What is a good name for a cat? A cat"}],
     "unknown_field": "ignored"},
    {"id": "he-1", "class": "high_entropy", "prompt": "A man is walking his dog in the park. He", "temperature": 1.0, "seed": 7},
    {"id": "he-2", "class": "high_entropy", "prompt": "The camera pans over a crowd. Then", "temperature": 0.8, "top_p": 0.9},
]


def make_parser() -> argparse.ArgumentParser:
    from lookahead.bench.cli import register

    parser = argparse.ArgumentParser(prog="lookahead")
    register(parser.add_subparsers(dest="command", required=True))
    return parser


@dataclass
class CliResult:
    rc: int
    out: str
    err: str

    def json_line(self) -> dict:
        return json.loads(self.out.strip().splitlines()[-1])


def run_cli(argv: list[str]) -> CliResult:
    """Run one subcommand in-process, as `lookahead ARGV...` would."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        args = make_parser().parse_args(argv)
        rc = args.func(args)
    return CliResult(rc, out.getvalue(), err.getvalue())


def write_workload(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def bench_argv(model: Path, workload: Path, out: Path, *extra: str, strategies: str = STRATEGIES) -> list[str]:
    # float32 named: "auto" would time the tiny random model's dtypes, and those timings mean nothing
    return ["bench", "--model", str(model), "--workload", str(workload), "--strategies", strategies,
            "--max-new-tokens", "16", "--dtype", "float32", "--no-progress", "--out", str(out), *extra]
