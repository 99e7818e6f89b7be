"""Overload (429 at once), request timeouts, and clients that disconnect mid-stream.

A GatedStream holds the model worker inside a decoding step until the test opens the gate, so the
queue states are exact rather than timing-dependent.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest

import lookahead
from lookahead.server import ServerConfig

from .live import CHAT, GatedStream, Live, serve

MODEL = "tiny-llama"


def body(max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": CHAT, "max_tokens": max_tokens, "temperature": 0, **extra}


def start_held_stream(server: Live, gate: GatedStream, max_tokens: int = 200) -> tuple[httpx.Client, Any, Any]:
    """Open a streaming request that occupies the worker: it has produced exactly one step."""
    gate.hold()
    gate.release(1)
    http = server.http()
    stream = http.stream("POST", "/v1/chat/completions", json=body(max_tokens, stream=True))
    response = stream.__enter__()
    lines = (line for line in response.iter_lines() if line)
    assert json.loads(next(lines).removeprefix("data: "))["choices"][0]["delta"]["role"] == "assistant"
    assert "content" in json.loads(next(lines).removeprefix("data: "))["choices"][0]["delta"]
    return http, stream, lines


def test_overload_gets_429_at_once_and_the_rest_complete(tiny: Any) -> None:
    gate = GatedStream()
    max_queue, extra = 3, 4
    reference = lookahead.generate(tiny, CHAT, max_new_tokens=12, strategy="autoregressive").text
    with serve(tiny, ServerConfig(max_queue=max_queue), stream_fn=gate) as server:
        http, stream, _ = start_held_stream(server, gate)
        client = server.openai()

        def ask(_: int) -> tuple[str, Any, float]:
            t0 = time.monotonic()
            try:
                reply = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12, temperature=0)
                return "ok", reply.choices[0].message.content, time.monotonic() - t0
            except openai.RateLimitError as exc:
                return "429", exc.response, time.monotonic() - t0

        with ThreadPoolExecutor(max_queue + extra) as pool:
            futures = [pool.submit(ask, i) for i in range(max_queue + extra)]
            deadline = time.monotonic() + 20
            while sum(f.done() for f in futures) < extra and time.monotonic() < deadline:
                time.sleep(0.02)
            # While the worker is held, exactly the overflow has been answered, all with 429.
            done = [f.result() for f in futures if f.done()]
            assert [d[0] for d in done] == ["429"] * extra
            for _, response, seconds in done:
                assert int(response.headers["Retry-After"]) >= 1
                assert response.json()["error"]["code"] == "queue_full"
                assert seconds < 5
            gate.open()
            results = [f.result() for f in futures]
        stream.__exit__(None, None, None)
        http.close()
        oks = [r for r in results if r[0] == "ok"]
        assert len(oks) == max_queue and all(text == reference for _, text, _ in oks)
        metrics = server.http().get("/metrics").text
        assert (
            f'lookahead_rejected_requests_total{{reason="queue_full",request_class="default"}} {float(extra)}'
            in metrics
        )


def test_timeout_non_streaming_and_streaming(tiny: Any) -> None:
    gate = GatedStream()
    with serve(tiny, ServerConfig(request_timeout_s=0.5), stream_fn=gate) as server:
        gate.hold()
        with server.http() as http:
            t0 = time.monotonic()
            r = http.post("/v1/chat/completions", json=body(50))
            assert r.status_code == 408 and time.monotonic() - t0 < 5
            assert r.json()["error"]["code"] == "request_timeout"
            assert r.headers["x-should-retry"] == "false"  # so the openai client does not resend it
            assert "--request-timeout" in r.json()["error"]["message"]
            gate.open()
            assert server.worker_idle()
            gate.hold()
            with http.stream(
                "POST", "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 50, "stream": True}
            ) as s:
                events = [line for line in s.iter_lines() if line]
            assert json.loads(events[-1].removeprefix("data: "))["error"]["code"] == "request_timeout"
            gate.open()
            assert server.worker_idle()
        gate.hold()
        with pytest.raises(openai.APIError) as err:  # the official client sees the error event too
            list(server.openai().chat.completions.create(model=MODEL, messages=CHAT, max_tokens=50, stream=True))
        assert "request timeout" in str(err.value)
        gate.open()


def test_disconnect_stops_generation_within_one_step_and_frees_the_worker(tiny: Any) -> None:
    gate = GatedStream()
    reference = lookahead.generate(tiny, CHAT, max_new_tokens=20, strategy="autoregressive").text
    with serve(tiny, ServerConfig(), stream_fn=gate) as server:
        http, stream, _ = start_held_stream(server, gate, max_tokens=500)
        assert gate.steps == 1
        stream.__exit__(None, None, None)  # the client drops the connection mid-stream
        http.close()
        time.sleep(0.3)  # the server notices the disconnect and flags the job
        gate.release(1)  # let the step in progress finish: the worker must stop right after it
        assert server.worker_idle(5)
        # Closed after at most the one step in progress (1 if the worker saw the flag before asking for step 2).
        assert gate.closed == 1 and gate.steps in (1, 2)
        gate.open()
        t0 = time.monotonic()
        reply = server.openai().chat.completions.create(model=MODEL, messages=CHAT, max_tokens=20, temperature=0)
        assert time.monotonic() - t0 < 10
        assert reply.choices[0].message.content == reference
        metrics = server.http().get("/metrics").text
        assert 'status="disconnect",strategy="lookahead"} 1.0' in metrics


def test_disconnect_without_gate_frees_the_worker(tiny: Any) -> None:
    """The same with the plain engine: a long stream dropped early ends long before its budget."""
    with serve(tiny, ServerConfig()) as server:
        with server.http() as http, http.stream("POST", "/v1/chat/completions", json=body(900, stream=True)) as s:
            lines = s.iter_lines()
            for _ in range(3):
                next(lines)
        t0 = time.monotonic()
        assert server.worker_idle(10)
        assert time.monotonic() - t0 < 2.0  # 900 tokens would take several seconds
        families = server.http().get("/metrics").text
        generated = [l for l in families.splitlines() if l.startswith("lookahead_generated_tokens_total{")]
        assert generated and float(generated[0].split()[-1]) < 900
