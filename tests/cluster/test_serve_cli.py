"""`lookahead serve --ray` as an operator runs it: a local Ray instance started by the command, one
replica of the tiny model, a request, then SIGTERM: the replicas drain and the command exits 0.
(After test_ray_serve.py's module has shut its own Ray instance down: one local instance at a time.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from ..server.live import free_port

pytest.importorskip("ray", reason="the [ray] extra is part of `make setup`")


def lookahead_cli(*args: str, **kwargs: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "lookahead.cli.main", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            **kwargs)  # type: ignore[call-overload]


def test_serve_ray_starts_serves_and_drains_on_sigterm() -> None:
    port = free_port()
    proc = lookahead_cli("serve", "--ray", "--model", "tiny:llama", "--dtype", "float32", "--replicas", "1",
                         "--threads-per-replica", "1", "--port", str(port), "--log-level", "warning")
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("lookahead: serving"):
                break
        assert lines and lines[-1].startswith("lookahead: serving"), "".join(lines)
        assert "1 replica(s) on a local Ray instance" in lines[-1]
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=60,
                       json={"model": "tiny-llama", "prompt": "hello", "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, "".join(lines) + out
    assert "lookahead: draining the replicas" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--min-replicas", "1"], "--min-replicas only applies with --ray"),
        (["--ray", "--class-replicas", "chat"], "write CLASS=N"),
        (["--ray", "--replicas", "0"], "replicas must be an integer >= 1"),
        (["--ray", "--min-replicas", "2", "--max-replicas", "3", "--replicas", "1"], "must lie within"),
        (["--ray", "--ngram-cache-file", "/tmp/x.json"], "each replica keeps its own caches"),
        (["--ray", "--threads", "2"], "under --ray give --threads-per-replica"),
        (["--threads-per-replica", "1"], "--threads-per-replica only applies with --ray"),
        (["--ray", "--threads-per-replica", "0"], "threads must be an integer >= 1"),
    ],
)
def test_bad_ray_flags_exit_2_with_one_line(args: list[str], message: str) -> None:
    proc = lookahead_cli("serve", "--port", str(free_port()), *args)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2 and message in out, out
