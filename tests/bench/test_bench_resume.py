"""Interrupted runs resume without duplicates or losses; a planted mismatch fails the run; bad input exits 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.bench.bench_helpers import bench_argv, run_cli, write_workload

import lookahead.bench.run as run_mod
from lookahead.bench import runners

SMALL = [
    {"id": "a", "class": "code", "messages": [{"role": "user", "content": "def f(x):\n    return x\n\ndef g(x):"}]},
    {"id": "b", "class": "code", "messages": [{"role": "user", "content": "a = 1\nb = 2\nc ="}]},
    {"id": "c", "class": "chat", "prompt": "Once upon a time there was a", "temperature": 1.0, "seed": 3},
]
FAST = ("--profile-contexts", "none", "--no-warmup")


def rows_of(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines() if x.strip()]


def counting(monkeypatch: pytest.MonkeyPatch, interrupt_at: int | None) -> list[str]:
    """Wrap every runner: record calls, raise KeyboardInterrupt (as Ctrl-C would) at call `interrupt_at`."""
    calls: list[str] = []
    real = runners.get_runner

    def get_runner(name: str):
        inner = real(name)

        def run(loaded, ids, spec):
            calls.append(name)
            if interrupt_at is not None and len(calls) == interrupt_at:
                raise KeyboardInterrupt
            return inner(loaded, ids, spec)

        return run

    monkeypatch.setattr(run_mod, "get_runner", get_runner)
    return calls


def test_interrupted_run_resumes_without_duplicates_or_losses(tiny_model_dir: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    wl = write_workload(tmp_path / "w.jsonl", SMALL)
    out = tmp_path / "out"
    argv = bench_argv(tiny_model_dir, wl, out, *FAST, strategies="autoregressive,lookahead")
    counting(monkeypatch, interrupt_at=4)
    first = run_cli(argv)
    assert first.rc == 130 and "rerun the same command to resume" in first.err
    saved = rows_of(out)
    assert len(saved) == 3 and not (out / "summary.json").exists()
    with (out / "results.jsonl").open("a") as fh:  # a row cut short by the interrupt
        fh.write('{"request_id": "b", "class": "co')

    calls = counting(monkeypatch, interrupt_at=None)
    second = run_cli(argv)
    assert second.rc == 0, second.err
    assert "removed an incomplete last row" in second.err
    assert len(calls) == 3  # only what was missing
    rows = rows_of(out)
    keys = [(r["request_id"], r["strategy"], r["repeat"]) for r in rows]
    assert len(keys) == len(set(keys)) == 6
    assert rows[:3] == saved  # nothing already measured was lost or re-measured
    assert json.loads((out / "summary.json").read_text())["rows"] == 6

    calls = counting(monkeypatch, interrupt_at=None)
    third = run_cli(argv)
    assert third.rc == 0 and calls == [] and rows_of(out) == rows

    other = run_cli(bench_argv(tiny_model_dir, wl, out, *FAST, "--max-new-tokens", "8",
                               strategies="autoregressive,lookahead"))
    assert other.rc == 2 and "holds a run with other settings" in other.err


def test_planted_mismatch_fails_the_run(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wl = write_workload(tmp_path / "w.jsonl", SMALL)
    argv = bench_argv(tiny_model_dir, wl, tmp_path / "out", *FAST, strategies="autoregressive,planted_mismatch")
    refused = run_cli(argv)  # without the test hook the name does not exist
    assert refused.rc == 2 and "unknown strategy planted_mismatch" in refused.err

    honest = runners.engine_runner("autoregressive")

    def planted(loaded, ids, spec):
        m = honest(loaded, ids, spec)
        toks = list(m.token_ids)
        toks[2] = (toks[2] + 1) % 256  # one wrong byte token, never an end-of-sequence token
        return runners.Measurement(**{**m.__dict__, "token_ids": tuple(toks)})

    monkeypatch.setitem(runners.EXTRA_RUNNERS, "planted_mismatch", planted)
    res = run_cli(argv)
    assert res.rc == 1
    assert res.err.count("!!! MISMATCH") == 3 and "at new token 2" in res.err
    assert res.json_line()["mismatches"] == 3
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["identity"]["mismatches"] == 3
    assert {m["request_id"] for m in summary["identity"]["mismatched"]} == {"a", "b", "c"}
    assert "WARNING: 3 of 3 checked outputs differ" in (tmp_path / "out" / "report.md").read_text()
    assert all(r["identical"] is False for r in rows_of(tmp_path / "out") if r["strategy"] == "planted_mismatch")
    again = run_cli(argv)  # resumed with nothing left to run: still fails, from the saved rows
    assert again.rc == 1 and again.json_line()["mismatches"] == 3


@pytest.mark.parametrize("extra, message", [
    (["--strategies", "autoregressive,warp"], "unknown strategy warp; choose from"),
    (["--strategies", "lookahead"], "--strategies must include autoregressive"),
    (["--strategies", "autoregressive"], "needs at least one strategy besides autoregressive"),
    (["--lookahead", "4,4"], "--lookahead takes three integers W,N,G"),
    (["--lookahead", "0,4,4"], "window (W) must be an integer >= 1"),
    (["--mix", "code=1,poetry=2"], "--mix names poetry, not in the workload"),
    (["--mix", "code=-1"], "--mix share for 'code' must be >= 0"),
    (["--classes", "poetry"], "--classes names poetry, not in the workload"),
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--model", "/no/such/model"], "no model at '/no/such/model'"),
])
def test_bad_input_exits_2_with_one_error_line(tmp_path: Path, tiny_model_dir: Path, extra: list[str], message: str) -> None:
    wl = write_workload(tmp_path / "w.jsonl", SMALL)
    argv = bench_argv(tiny_model_dir, wl, tmp_path / "out", *FAST) + extra
    res = run_cli(argv)
    assert res.rc == 2
    assert res.err.strip().splitlines()[-1].startswith("error: ") and message in res.err
    assert "Traceback" not in res.err


def test_bad_workload_line_is_reported(tmp_path: Path, tiny_model_dir: Path) -> None:
    wl = tmp_path / "w.jsonl"
    wl.write_text(json.dumps(SMALL[0]) + "\n{oops\n")
    res = run_cli(bench_argv(tiny_model_dir, wl, tmp_path / "out", *FAST))
    assert res.rc == 2 and f"{wl}:2: not valid JSON" in res.err


def test_wired_into_the_main_cli(tmp_path: Path) -> None:
    from lookahead.cli.main import main

    wl = write_workload(tmp_path / "w.jsonl", SMALL)
    assert main(["workloads", "check", str(wl)]) == 0
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--workload", str(wl)])  # --out missing: argparse's one-line error
    assert exc.value.code == 2


def test_too_long_prompt_is_skipped_and_reported(tiny_model_dir: Path, tmp_path: Path) -> None:
    long = {"id": "long", "class": "code", "prompt": "word " * 250}  # 1250 byte tokens > the tiny model's 1024
    wl = write_workload(tmp_path / "w.jsonl", SMALL + [long])
    res = run_cli(bench_argv(tiny_model_dir, wl, tmp_path / "out", *FAST, strategies="autoregressive,lookahead"))
    assert res.rc == 0, res.err
    assert "skipping long:" in res.err and "exceed the model's context of 1024" in res.err
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [s["request_id"] for s in summary["skipped"]] == ["long"] and summary["requests"] == 3
    assert "Skipped requests" in (tmp_path / "out" / "report.md").read_text()


def test_no_pack_reaches_the_config_and_a_resumed_run_must_match_it(tmp_path: Path) -> None:
    # timings depend on packing, so a run resumed with the other setting would mix incomparable rows
    from lookahead.bench.cli import bench_config
    from lookahead.cli.main import build_parser

    argv = ["bench", "--model", "tiny:llama", "--workload", str(tmp_path / "w.jsonl"), "--out", str(tmp_path / "o")]
    packed, plain = (bench_config(build_parser().parse_args(argv + extra)) for extra in ([], ["--no-pack"]))
    assert packed.pack is True and plain.pack is False
    assert packed.fingerprint()["pack"] is True and plain.fingerprint() != packed.fingerprint()
