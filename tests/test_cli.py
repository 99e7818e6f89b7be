"""CLI: bad input gives exit code 2 and a one-line message, never a traceback; --json/--compare shapes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lookahead.cli.main import main

TINY = ["--model", "tiny:llama"]


@pytest.mark.parametrize("argv, needle", [
    (["generate", "", *TINY], "prompt is empty"),
    (["generate", "   ", *TINY], "prompt is empty"),
    (["generate", "hi", *TINY, "--max-new-tokens", "0"], "max-new-tokens"),
    (["generate", "hi", *TINY, "--window", "0"], "window"),
    (["generate", "hi", *TINY, "--ngram", "1"], "ngram"),
    (["generate", "hi", *TINY, "--guesses", "-1"], "guesses"),
    (["generate", "hi", *TINY, "--context-tokens", "0"], "context_tokens"),
    (["generate", "hi", *TINY, "--top-p", "0"], "top_p"),
    (["generate", "hi", *TINY, "--top-p", "1.5"], "top_p"),
    (["generate", "hi", *TINY, "--temperature", "-0.1"], "temperature"),
    (["generate", "hi", "--model", "no-such-model"], "no model at"),
    (["generate", "hi", "--model", "/nonexistent/dir/model.gguf"], "no model at"),
    (["generate", "hi", *TINY, "--dtype", "float7"], "dtype"),
    (["generate", "x " * 1500, *TINY, "--raw"], "context"),
    (["generate", "hi", *TINY, "--strategy", "telepathy"], "strategy"),
])
def test_bad_input_exits_2_with_a_message(argv, needle, capsys) -> None:
    assert _exit_code(argv) == 2
    err = capsys.readouterr().err
    assert needle in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_corrupt_gguf_is_reported(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    assert main(["generate", "hi", "--model", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "cannot read GGUF" in err and "Traceback" not in err


def test_json_output_shape(capsys) -> None:
    assert main(["generate", "hello hello", *TINY, "--json", "--max-new-tokens", "12"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"text", "token_ids", "finish_reason", "strategy", "dtype", "width_floor", "stats",
                        "packed_linears"}
    assert out["dtype"] == "float32"  # tiny test models stay float32 under --dtype auto
    assert out["width_floor"] is None or (isinstance(out["width_floor"], int) and out["width_floor"] >= 1)
    for key in ("prompt_tokens", "new_tokens", "steps", "tokens_per_step", "guesses_verified",
                "guesses_accepted", "prefill_s", "decode_s", "tokens_per_s"):
        assert key in out["stats"]
    assert out["stats"]["new_tokens"] == len(out["token_ids"]) == 12


def test_no_pack_runs_the_plain_kernels(capsys) -> None:
    import lookahead

    packed = lookahead.load("tiny:llama", probe=False).packed  # what the default packs on this machine
    for flags, expected in (([], packed), (["--no-pack"], 0)):
        assert main(["generate", "hello hello", *TINY, "--json", "--max-new-tokens", "4", *flags]) == 0
        assert json.loads(capsys.readouterr().out)["packed_linears"] == expected, flags


def test_compare_json_reports_identity_and_speedup(capsys) -> None:
    # 48 prompt tokens: three whole blocks the prefix cache would hand the second run, had it one
    assert main(["generate", "abc" * 16, *TINY, "--raw", "--compare", "--json", "--max-new-tokens", "20"]) == 0
    out = json.loads(capsys.readouterr().out)
    # both runs prefill the whole prompt: the whole-call times compare
    assert out["autoregressive"]["stats"]["cached_tokens"] == out["lookahead"]["stats"]["cached_tokens"] == 0
    assert out["identical"] is True
    assert out["dtype"] == "float32" and out["width_floor"] == out["lookahead"]["width_floor"]
    assert out["autoregressive"]["token_ids"] == out["lookahead"]["token_ids"]
    assert out["speedup"] > 0


def test_stdin_prompt_and_stream_via_subprocess() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "lookahead.cli.main", "generate", "-", *TINY, "--stream", "--max-new-tokens", "8"],
        input="hello", capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "tokens/step" in proc.stderr


def _exit_code(argv: list[str]) -> int:
    """main()'s return value, or the code argparse exits with."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)
