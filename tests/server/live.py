"""Helpers for the server tests: a live uvicorn server on 127.0.0.1 in a background thread."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import httpx
import openai
import uvicorn

import lookahead
from lookahead.server import ServerConfig, create_app
from lookahead.server.cli import uvicorn_config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Live:
    url: str
    app: Any

    def openai(self, api_key: str = "none", **kwargs: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=60, **kwargs)

    def http(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60, **kwargs)

    def worker_idle(self, timeout_s: float = 10.0) -> bool:
        """Wait until the model worker has nothing running or queued."""
        worker = self.app.state.worker
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if worker.in_flight == 0 and worker.queue_depth == 0:
                return True
            time.sleep(0.01)
        return False


@contextmanager
def serve(loaded: Any, config: ServerConfig | None = None, *, stream_fn: Any = None) -> Iterator[Live]:
    """Run create_app(loaded, config) under uvicorn, configured as `lookahead serve` does, in a
    background thread for the with-block."""
    config = config or ServerConfig()
    app = create_app(loaded, config, stream_fn=stream_fn)
    port = free_port()
    server = uvicorn.Server(uvicorn_config(app, config, log_level="warning", host="127.0.0.1", port=port))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield Live(url=f"http://127.0.0.1:{port}", app=app)
    finally:
        server.should_exit = True
        thread.join(30)


class GatedStream:
    """The real engine's stream_events, but each step waits for the test to open the gate.

    While `gated` is False steps run freely. `steps` counts steps handed out, `closed` counts
    generators closed early (as the worker does on cancel)."""

    def __init__(self) -> None:
        self.gated = False
        self._permits = threading.Semaphore(0)
        self.steps = 0
        self.closed = 0
        self.lock = threading.Lock()

    def release(self, n: int = 1) -> None:
        """Let n more steps through."""
        self._permits.release(n)

    def hold(self) -> None:
        """From now on every step waits for release()."""
        while self._permits.acquire(blocking=False):
            pass
        self.gated = True

    def open(self) -> None:
        """Let every step through, including one waiting now."""
        self.gated = False
        self._permits.release(1)

    def __call__(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        inner = cast(Generator[Any, None, None], lookahead.stream_events(*args, **kwargs))
        finished = False
        try:
            for event in inner:
                if self.gated and not self._permits.acquire(timeout=30):
                    raise RuntimeError("test gate never opened")
                with self.lock:
                    self.steps += 1
                yield event
            finished = True
        finally:
            inner.close()
            if not finished:
                with self.lock:
                    self.closed += 1


CHAT: list[Any] = [{"role": "user", "content": "Write a haiku about lookahead decoding."}]
