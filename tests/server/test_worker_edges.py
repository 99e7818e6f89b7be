"""Overload (429 at once), request timeouts, and clients that disconnect mid-stream.

A GatedStream holds the model worker inside a decoding step until the test opens the gate, so the
queue states are exact rather than timing-dependent. Where a test must wait for the server to notice
something (a disconnect), it waits on an event, never for a fixed time, and no verdict is a duration.
"""

from __future__ import annotations

import asyncio
import json
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import httpx
import openai
import pytest

import lookahead
from lookahead.config import SamplingConfig
from lookahead.policy import Decision
from lookahead.server import ServerConfig
from lookahead.server.errors import APIError
from lookahead.server.metrics import ServerMetrics
from lookahead.server.worker import Job, JobEnd, JobSpec, ModelWorker

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

        def ask(_: int) -> tuple[str, Any]:
            try:
                reply = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12, temperature=0)
                return "ok", reply.choices[0].message.content
            except openai.RateLimitError as exc:
                return "429", exc.response

        with ThreadPoolExecutor(max_queue + extra) as pool:
            futures = [pool.submit(ask, i) for i in range(max_queue + extra)]
            deadline = time.monotonic() + 20
            while sum(f.done() for f in futures) < extra and time.monotonic() < deadline:
                time.sleep(0.02)
            # While the worker is held (so "at once": nothing waited for the queue to move), exactly the
            # overflow has been answered, all with 429.
            done = [f.result() for f in futures if f.done()]
            assert [d[0] for d in done] == ["429"] * extra and gate.steps == 1
            for _, response in done:
                assert int(response.headers["Retry-After"]) >= 1
                assert response.json()["error"]["code"] == "queue_full"
            gate.open()
            results = [f.result() for f in futures]
        stream.__exit__(None, None, None)
        http.close()
        oks = [r for r in results if r[0] == "ok"]
        assert len(oks) == max_queue and all(text == reference for _, text in oks)
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
            # The gate holds the step for 30 s; only the 0.5 s request timeout can answer 408 before that.
            r = http.post("/v1/chat/completions", json=body(50))
            assert r.status_code == 408
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


def watch_cancels(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, list[str]]:
    """From now on every Job.cancel(reason) is recorded; the event is set by the first one."""
    first, reasons = threading.Event(), []
    original = Job.cancel

    def cancel(job: Job, reason: str) -> None:
        reasons.append(reason)
        original(job, reason)
        first.set()

    monkeypatch.setattr(Job, "cancel", cancel)
    return first, reasons


def test_disconnect_stops_generation_within_one_step_and_frees_the_worker(
    tiny: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = GatedStream()
    reference = lookahead.generate(tiny, CHAT, max_new_tokens=20, strategy="autoregressive").text
    with serve(tiny, ServerConfig(), stream_fn=gate) as server:
        http, stream, _ = start_held_stream(server, gate, max_tokens=500)
        assert gate.steps == 1
        cancelled, reasons = watch_cancels(monkeypatch)
        stream.__exit__(None, None, None)  # the client drops the connection mid-stream
        http.close()
        assert cancelled.wait(30), "the server never noticed the disconnect"  # it flags the job
        assert reasons[0] == "disconnect"
        gate.release(1)  # let the step in progress finish: the worker must stop right after it
        assert server.worker_idle(30)
        # Closed after at most the one step in progress (1 if the worker saw the flag before asking for step 2).
        assert gate.closed == 1 and gate.steps in (1, 2)
        gate.open()
        reply = server.openai().chat.completions.create(model=MODEL, messages=CHAT, max_tokens=20, temperature=0)
        assert reply.choices[0].message.content == reference
        metrics = server.http().get("/metrics").text
        assert 'status="disconnect",strategy="lookahead"} 1.0' in metrics


def test_disconnect_without_gate_frees_the_worker(tiny: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same with free-running steps: a long stream dropped early ends within one more step.

    No gate holds the steps. One barrier makes the verdict independent of the machine's speed: if the
    server has not flagged the job by the engine's 4th step, that step waits until it has (so the
    900-token budget cannot run out first on a fast machine). Then at most one step may be handed out
    after the flag: the one in progress when it was set."""
    cancelled, reasons = watch_cancels(monkeypatch)
    after_flag: list[bool] = []  # per step handed out to the worker: was the job flagged already?
    tokens: list[int] = []

    def engine(*args: Any, **kwargs: Any) -> Any:
        inner = lookahead.stream_events(*args, **kwargs)
        try:
            for i, event in enumerate(inner):
                if i == 3:
                    assert cancelled.wait(30), "the server never noticed the disconnect"
                after_flag.append(cancelled.is_set())
                tokens.append(len(event.token_ids))
                yield event
        finally:
            inner.close()

    with serve(tiny, ServerConfig(), stream_fn=engine) as server:
        with server.http() as http, http.stream("POST", "/v1/chat/completions", json=body(900, stream=True)) as s:
            lines = s.iter_lines()
            for _ in range(3):
                next(lines)
        assert server.worker_idle(30)
        assert reasons[0] == "disconnect"
        assert len(after_flag) <= 4 and sum(after_flag) <= 1, after_flag
        families = server.http().get("/metrics").text
        generated = [l for l in families.splitlines() if l.startswith("lookahead_generated_tokens_total{")]
        assert generated and float(generated[0].split()[-1]) == sum(tokens) < 900


# -- shutdown races (issue 14, item 8): a job must never run uncancelled once shutdown has begun ------


class RecordingJob(Job):
    """A job whose events land in a list (no event loop needed); `ended` is set by its JobEnd."""

    def __init__(self) -> None:
        spec = JobSpec((1, 2, 3), 4, Decision("autoregressive"), SamplingConfig(), (), "default")
        super().__init__(spec, cast(asyncio.AbstractEventLoop, None), timeout_s=600)  # push() needs no loop
        self.items: list[Any] = []
        self.ended = threading.Event()

    def push(self, item: Any) -> None:
        self.items.append(item)
        if isinstance(item, JobEnd):
            self.ended.set()


class PausingQueue(queue.Queue):  # type: ignore[type-arg]
    """The worker's queue, with a pause right after the worker's blocking get() returns a job, and
    one right before submit() queues a job: the two windows of the shutdown races."""

    def __init__(self, maxsize: int) -> None:
        super().__init__(maxsize)
        self.after_get: Callable[[], None] = lambda: None
        self.before_put: Callable[[], None] = lambda: None

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        item = super().get(block, timeout)
        if block and item is not None:  # the worker thread's dequeue, not cancel_all's drain
            self.after_get()
        return item

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        if item is not None:  # submit(), not stop()'s end marker
            self.before_put()
        super().put(item, block, timeout)


def bare_worker() -> tuple[ModelWorker, PausingQueue, list[Any]]:
    """A worker whose engine only records that it was asked to run something."""
    started: list[Any] = []

    def engine(*args: Any, **kwargs: Any) -> Iterator[Any]:
        started.append(kwargs)
        raise AssertionError("a job ran after shutdown began")

    metrics = ServerMetrics(
        price_per_hour_usd=0.0, known_classes=[], max_class_labels=4, queue_depth=lambda: 0, in_flight=lambda: 0
    )
    worker = ModelWorker(object(), metrics, max_queue=4, stream_fn=engine)
    worker._queue = pausing = PausingQueue(4)
    return worker, pausing, started


def pause_point() -> tuple[threading.Event, threading.Event, Callable[[], None]]:
    """(reached, resume, pause): `pause` sets `reached`, then waits for `resume`."""
    reached, resume = threading.Event(), threading.Event()

    def pause() -> None:
        reached.set()
        assert resume.wait(30)

    return reached, resume, pause


def assert_refused_with_503(job: RecordingJob, started: list[Any]) -> None:
    assert job.ended.wait(30), "the job never ended"
    end = job.items[-1]
    assert isinstance(end, JobEnd) and end.error is not None and end.error.code == "shutting_down", end
    assert started == []  # the engine was never asked to run it


def test_shutdown_between_dequeue_and_current_cancels_the_job() -> None:
    worker, pausing, started = bare_worker()
    dequeued, resume, pausing.after_get = pause_point()
    worker.start()
    job = RecordingJob()
    worker.submit(job)
    assert dequeued.wait(30)  # the worker holds the job but has not marked it current
    worker.cancel_all()  # finds an empty queue and no current job
    resume.set()
    assert_refused_with_503(job, started)
    worker.stop(30)


def test_shutdown_between_stopping_check_and_queueing_cancels_the_job() -> None:
    worker, pausing, started = bare_worker()
    checked, resume, pausing.before_put = pause_point()
    worker.start()
    job = RecordingJob()
    submitter = threading.Thread(target=worker.submit, args=(job,))
    submitter.start()
    assert checked.wait(30)  # submit() has seen "not stopping" but not queued the job yet
    shutdown = threading.Thread(target=worker.cancel_all)
    shutdown.start()
    assert worker._stopping.wait(30)  # shutdown has begun (its drain may wait for the submit to finish)
    resume.set()
    submitter.join(30)
    shutdown.join(30)
    assert not submitter.is_alive() and not shutdown.is_alive()
    assert_refused_with_503(job, started)
    worker.stop(30)


def test_submit_after_shutdown_is_refused_with_503() -> None:
    worker, _, started = bare_worker()
    worker.start()
    worker.cancel_all()
    with pytest.raises(APIError) as err:
        worker.submit(RecordingJob())
    assert err.value.status == 503 and err.value.code == "shutting_down"
    worker.stop(30)
    assert started == []
