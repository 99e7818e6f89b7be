"""`lookahead serve` / `python -m lookahead.server`: flags, one-line errors, graceful SIGTERM.

The SIGTERM tests run the server through tests/server/paced_server.py, whose engine holds a request
after its first step until the moment under test (shutdown begun, or in-flight work cancelled), so
the verdicts do not depend on how fast this machine decodes."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from lookahead.server.cli import register, serve_command

from .live import free_port

ROOT = Path(__file__).resolve().parents[2]


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="lookahead")
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["serve", *argv])


def test_register_adds_serve_with_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOOKAHEAD_API_KEY", raising=False)
    args = parse()
    assert args.func is serve_command
    assert (args.host, args.port, args.api_key, args.max_queue) == ("127.0.0.1", 8000, None, 16)
    monkeypatch.setenv("LOOKAHEAD_API_KEY", "from-env")
    assert parse().api_key == "from-env"
    assert parse("--api-key", "flag").api_key == "flag"
    assert parse().pack is True and parse("--no-pack").pack is False


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--max-queue", "0"], "max queue must be an integer >= 1"),
        (["--request-timeout", "0"], "request timeout must be > 0"),
        (["--price-per-hour", "-1"], "price per hour"),
        (["--port", "70000"], "port must be"),
        (["--api-key", " "], "API key is empty"),
        (["--policy", "/nonexistent/policy.json"], "does not exist"),
        (["--model", "/nonexistent/model"], "no model at '/nonexistent/model'"),
        (["--model", "tiny:llama", "--dtype", "float8"], "unknown dtype 'float8'"),
        (["--model", "tiny:transformer"], "unknown tiny model"),
        (["--max-batch", "0"], "max batch must be an integer >= 1"),
        (["--max-batch", "4", "--max-rows", "3"], "max rows must be an integer >= 4"),
        (["--max-kv-tokens", "0"], "max kv tokens must be an integer >= 1"),
        (["--prefix-cache-mb", "-1"], "prefix cache mb must be an integer >= 0"),
    ],
)
def test_bad_flags_exit_2_with_one_error_line(
    argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert serve_command(parse("--port", str(free_port()), *argv)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and fragment in err[0], err


def test_malformed_policy_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"version": 1, "default": {"strategy": "beam"}}))
    assert serve_command(parse("--policy", str(policy))) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "default: unknown strategy 'beam'" in err


def test_corrupt_ngram_cache_file_exits_2_before_loading_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "caches.json"
    cache.write_text("{not json")
    argv = ("--port", str(free_port()), "--model", "/nonexistent/model", "--ngram-cache", "code")
    assert serve_command(parse(*argv, "--ngram-cache-file", str(cache))) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # The file is checked first: the error names it, not the (also missing) model.
    assert len(err) == 1 and "cannot read n-gram cache file" in err[0] and str(cache) in err[0], err


def test_unwritable_ngram_cache_folder_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ("--port", str(free_port()), "--ngram-cache", "code", "--ngram-cache-file", "/nonexistent/dir/c.json")
    assert serve_command(parse(*argv)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a writable folder" in err[0], err


def test_learned_file_in_a_missing_folder_exits_2_and_a_foreign_one_after_the_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ("--port", str(free_port()), "--model", "tiny:llama")
    assert serve_command(parse(*argv, "--learned-file", "/nonexistent/dir/l.json")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "learned-state file" in err[0] and "writable folder" in err[0], err
    foreign = tmp_path / "learned.json"
    foreign.write_text('{"version": 1, "model": "someone-else", "vocab": 7, "labels": {}}')
    assert serve_command(parse(*argv, "--learned-file", str(foreign))) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "learned on someone-else" in err[0] and "use a file per model" in err[0], err


def test_busy_port_exits_2_before_loading_the_model(capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[str] = []
    monkeypatch.setattr("lookahead.server.cli.load_model", lambda model, *a: loads.append(model))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        assert serve_command(parse("--port", str(busy.getsockname()[1]), "--model", "/not/loaded")) == 2
    assert loads == []  # the port was checked first: no model load was even started
    assert "choose another --port" in capsys.readouterr().err


def spawn_server(*extra: str, pace: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """A server process; with `pace`, the paced one (tests/server/paced_server.py) with these settings."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **(pace or {})}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lookahead.server" if pace is None else "tests.server.paced_server",
            "--model",
            "tiny:llama",
            "--port",
            str(port),
            "--log-level",
            "warning",
            *extra,
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return proc, f"http://127.0.0.1:{port}"


def wait_ready(proc: subprocess.Popen[str], url: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited early:\n{proc.stdout.read() if proc.stdout else ''}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError("server did not start")


@pytest.fixture(scope="module")
def release_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Created by the patient test to let its held request go on (see paced_server.py)."""
    return tmp_path_factory.mktemp("paced") / "release"


@pytest.fixture(scope="module")
def servers(release_file: Path) -> Iterator[dict[str, tuple[subprocess.Popen[str], str]]]:
    """Two server processes, started together to share the start-up time: grace 30 s and 1 s.

    The patient one holds a request after its first step until shutdown has begun and the test has
    created `release_file`; the hasty one until its grace period is over and in-flight work is cancelled."""
    patient = {"LOOKAHEAD_TEST_PAUSE_UNTIL": "shutdown", "LOOKAHEAD_TEST_RELEASE_FILE": str(release_file)}
    procs = {
        "patient": spawn_server("--shutdown-timeout", "30", pace=patient),
        "hasty": spawn_server("--shutdown-timeout", "1", pace={"LOOKAHEAD_TEST_PAUSE_UNTIL": "cancel"}),
    }
    try:
        for proc, url in procs.values():
            wait_ready(proc, url)
        yield procs
    finally:
        for proc, _ in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def stream_in_background(url: str, max_tokens: int) -> tuple[threading.Event, list[str], threading.Thread]:
    """Stream a completion on a thread: (set once the first line came, the lines, the thread)."""
    lines: list[str] = []
    first = threading.Event()

    def run() -> None:
        body = {
            "model": "tiny-llama",
            "prompt": "x",
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "lookahead": {"enabled": False},
        }
        try:
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line:
                        lines.append(line)
                        first.set()
        except httpx.HTTPError as exc:
            lines.append(f"transport error: {exc}")
        first.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return first, lines, thread


def refuses_connections(url: str, within_s: float = 30) -> bool:
    """Wait until the server no longer accepts connections (the listener closes soon after SIGTERM)."""
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            httpx.get(url + "/health", timeout=2)
        except httpx.TransportError:
            return True
        time.sleep(0.05)
    return False


def texts(lines: list[str]) -> list[str]:
    return [json.loads(l.removeprefix("data: "))["choices"][0]["text"] for l in lines if '"choices": [{' in l]


def test_sigterm_stops_accepting_finishes_in_flight_and_exits_0(servers: dict[str, Any], release_file: Path) -> None:
    proc, url = servers["patient"]
    first, lines, thread = stream_in_background(url, max_tokens=900)
    assert first.wait(30)
    proc.send_signal(signal.SIGTERM)
    assert refuses_connections(url)  # no longer accepting ...
    assert thread.is_alive() and "data: [DONE]" not in lines  # ... while the request is still held
    release_file.touch()  # let it go on: it must be finished, not cut
    assert proc.wait(60) == 0
    thread.join(30)
    assert lines[-1] == "data: [DONE]"
    assert not any(l.startswith('data: {"error"') for l in lines)
    assert len(texts(lines)) > 1  # steps ran after shutdown had begun


def test_sigterm_cancels_in_flight_work_after_the_bound(servers: dict[str, Any]) -> None:
    proc, url = servers["hasty"]
    first, lines, thread = stream_in_background(url, max_tokens=1000)
    assert first.wait(30)
    proc.send_signal(signal.SIGTERM)  # the request is held until the 1 s grace period is over
    assert proc.wait(60) == 0
    output = proc.stdout.read() if proc.stdout else ""
    assert "Traceback" not in output, output
    thread.join(30)
    assert json.loads(lines[-1].removeprefix("data: "))["error"]["code"] == "shutting_down"
    assert "data: [DONE]" not in lines


def test_serve_leaves_a_core_to_the_http_side_unless_told() -> None:
    from lookahead.errors import LookaheadError
    from lookahead.server.cli import model_threads

    assert [model_threads(None, cores) for cores in (1, 2, 16)] == [1, 1, 15]
    assert model_threads(3, 2) == 3  # as asked, even past the cores
    with pytest.raises(LookaheadError, match="--threads must be an integer >= 1"):
        model_threads(0, 2)
