"""`lookahead serve` / `python -m lookahead.server`: flags, one-line errors, graceful SIGTERM."""

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
        (["--model", "tiny:transformer"], "unknown tiny architecture"),
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


def test_busy_port_exits_2_before_loading_the_model(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        t0 = time.monotonic()
        assert serve_command(parse("--port", str(busy.getsockname()[1]), "--model", "/not/loaded")) == 2
        assert time.monotonic() - t0 < 5
    assert "choose another --port" in capsys.readouterr().err


def spawn_server(*extra: str) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lookahead.server",
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
def servers() -> Iterator[dict[str, tuple[subprocess.Popen[str], str]]]:
    """Two server processes, started together to share the start-up time: grace 30 s and 1 s."""
    procs = {"patient": spawn_server("--shutdown-timeout", "30"), "hasty": spawn_server("--shutdown-timeout", "1")}
    try:
        for proc, url in procs.values():
            wait_ready(proc, url)
        yield procs
    finally:
        for proc, _ in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def stream_in_background(url: str, max_tokens: int) -> tuple[threading.Event, list[str]]:
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

    threading.Thread(target=run, daemon=True).start()
    return first, lines


def test_sigterm_stops_accepting_finishes_in_flight_and_exits_0(servers: dict[str, Any]) -> None:
    proc, url = servers["patient"]
    first, lines = stream_in_background(url, max_tokens=900)
    assert first.wait(30)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    with pytest.raises(httpx.TransportError):  # no longer accepting
        httpx.get(url + "/health", timeout=2)
    assert proc.wait(60) == 0
    assert lines[-1] == "data: [DONE]"  # the in-flight stream was finished, not cut
    text = "".join(
        json.loads(l.removeprefix("data: "))["choices"][0]["text"] for l in lines[:-1] if '"choices": [{' in l
    )
    assert len(text) > 0


def test_sigterm_cancels_in_flight_work_after_the_bound(servers: dict[str, Any]) -> None:
    proc, url = servers["hasty"]
    first, lines = stream_in_background(url, max_tokens=1000)
    assert first.wait(30)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert time.monotonic() - t0 < 15
    output = proc.stdout.read() if proc.stdout else ""
    assert "Traceback" not in output, output
    deadline = time.monotonic() + 5
    while not lines[-1].startswith('data: {"error"') and time.monotonic() < deadline:
        time.sleep(0.05)
    assert json.loads(lines[-1].removeprefix("data: "))["error"]["code"] == "shutting_down"
