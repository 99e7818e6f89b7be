"""The ingress: Ray Serve's HTTP proxy hands it every request; it picks the engine deployment by request
class, relays the request to a replica (Ray Serve's router picks which) and the replica's answer back.

It answers three things itself: /health (the replicas Ray runs, per deployment), /metrics (every
replica's metrics through Ray's export, cluster/metrics.py) and a replica's failure:
  1. the replica died before it took the request (no ACCEPTED yet): sent again, to another replica;
  2. it died while running the request, before answering: 503 in OpenAI's shape, with Retry-After,
     which OpenAI clients retry;
  3. it died mid-stream: the stream ends with an OpenAI error event (the client saw part of it).
No other request is touched: each runs on its own replica, under its own handle call.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

from lookahead.cluster.bridge import ACCEPTED, wire_scope
from lookahead.server.errors import APIError
from lookahead.server.prepare import CLASS_HEADER
from lookahead.server.responses import sse

log = logging.getLogger("lookahead.cluster")

RESENDS = 3  # times a request is sent again after a replica died before taking it
_CLASS_HEADER = CLASS_HEADER.lower().encode()


def replica_failed(detail: str) -> APIError:
    return APIError(503, f"the replica serving this request failed ({detail}); retry the request",
                    type="server_error", code="replica_unavailable", headers={"Retry-After": "1"})


def _failure_kind(exc: BaseException) -> str | None:
    """'replica' for a replica that died or cannot be reached, 'busy' for Ray's queue limit, else None."""
    import ray.exceptions as rex
    from ray.serve import exceptions as sex

    if isinstance(exc, sex.BackPressureError):
        return "busy"
    if isinstance(exc, (rex.RayActorError, rex.ActorUnavailableError, sex.DeploymentUnavailableError,
                        getattr(sex, "ReplicaUnavailableError", rex.ActorUnavailableError))):
        return "replica"
    return None


class IngressApp:
    """A plain ASGI app. `handles`: deployment name -> DeploymentHandle; `routes`: class -> deployment;
    `default`: the deployment for every other request; `health`: () -> {deployment: {state: count}};
    `metrics`: () -> Prometheus text (blocking; run in a thread)."""

    def __init__(self, handles: dict[str, Any], routes: dict[str, str], default: str, *,
                 health: Callable[[], dict[str, dict[str, int]]], metrics: Callable[[], str],
                 max_body_bytes: int) -> None:
        self._handles = handles
        self._routes = routes
        self._default = default
        self._health = health
        self._metrics = metrics
        self._max_body = max_body_bytes

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if path == "/health" and method in ("GET", "HEAD"):
            await self._send_health(send)
        elif path == "/metrics" and method == "GET":
            text = await asyncio.to_thread(self._metrics)
            await _send(send, 200, text.encode(), b"text/plain; version=0.0.4; charset=utf-8")
        else:
            body = await _read_body(receive, self._max_body + 1)  # one byte over: the replica answers 413
            await self._relay(scope, body, receive, send)

    def deployment_of(self, scope: dict[str, Any], body: bytes) -> str:
        """Header X-Request-Class, else metadata.request_class in the JSON body; unknown or unreadable:
        the default deployment (which answers a bad class with the server's own 400)."""
        if not self._routes:
            return self._default
        cls = dict(scope.get("headers") or []).get(_CLASS_HEADER, b"").decode("latin-1") or None
        if cls is None:
            with contextlib.suppress(ValueError, AttributeError, TypeError):
                cls = json.loads(body).get("metadata", {}).get("request_class")
        return self._routes.get(cls, self._default) if isinstance(cls, str) else self._default

    async def _send_health(self, send: Callable[..., Any]) -> None:
        try:
            states = await asyncio.to_thread(self._health)
        except Exception as exc:  # the controller is unreachable: say so, as a failed health check
            await _send_json(send, 503, {"status": f"cannot reach the Ray Serve controller: {type(exc).__name__}"})
            return
        ok = bool(states) and all(s.get("RUNNING", 0) > 0 for s in states.values())
        running = sum(s.get("RUNNING", 0) for s in states.values())
        await _send_json(send, 200 if ok else 503, {
            "status": "ok" if ok else "a deployment has no running replica",
            "replicas": {"running": running, "deployments": states},
        })

    async def _relay(self, scope: dict[str, Any], body: bytes, receive: Callable[..., Any],
                     send: Callable[..., Any]) -> None:
        handle = self._handles[self.deployment_of(scope, body)].options(stream=True)
        wire = wire_scope(scope)
        gone = asyncio.create_task(_wait_disconnect(receive))
        started = False
        sse_stream = False
        try:
            for attempt in range(RESENDS + 1):
                accepted = False
                stream = handle.asgi.remote(wire, body)
                try:
                    async for message in _until(stream, gone):
                        if message["type"] == ACCEPTED:
                            accepted = True
                            continue
                        if message["type"] == "http.response.start":
                            started = True
                            content_type = dict(message.get("headers", [])).get(b"content-type", b"")
                            sse_stream = content_type.startswith(b"text/event-stream")
                        await send(message)
                    return
                except Exception as exc:
                    stream.cancel()
                    kind = _failure_kind(exc)
                    if kind == "replica" and not accepted and attempt < RESENDS:
                        log.warning("a replica died before taking a request; sending it again (%s)", exc)
                        await asyncio.sleep(0.2 * (attempt + 1))
                        continue
                    await self._fail(send, exc, kind, started, sse_stream)
                    return
        finally:
            gone.cancel()

    @staticmethod
    async def _fail(send: Callable[..., Any], exc: BaseException, kind: str | None, started: bool,
                    sse_stream: bool) -> None:
        if kind == "busy":
            err = APIError(429, "every replica is at its limit of requests in flight; retry shortly",
                           type="rate_limit_error", code="replicas_busy", headers={"Retry-After": "1"})
        elif kind == "replica":
            err = replica_failed(type(exc).__name__)
        else:
            log.error("relaying a request failed: %r", exc)
            err = APIError(500, f"the request failed in the cluster ({type(exc).__name__}); retry it",
                           type="server_error")
        if not started:
            headers = [(k.lower().encode(), v.encode()) for k, v in err.headers.items()]
            await _send(send, err.status, json.dumps(err.body()).encode(), b"application/json", headers)
        elif sse_stream:  # the client has part of a stream: end it with an error event, as the server does
            await send({"type": "http.response.body", "body": sse(err.body()).encode(), "more_body": False})
        else:
            await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _until(stream: Any, gone: asyncio.Task[None]) -> Any:
    """The handle's messages until the stream ends; stops (cancelling it) when the client disconnects."""
    iterator = stream.__aiter__()
    while True:
        step = asyncio.ensure_future(iterator.__anext__())
        done, _ = await asyncio.wait({step, gone}, return_when=asyncio.FIRST_COMPLETED)
        if step not in done:  # the client went away: cancelling the call tells the replica's app
            step.add_done_callback(lambda f: f.cancelled() or f.exception())  # nobody reads its outcome
            step.cancel()
            stream.cancel()
            return
        try:
            yield step.result()
        except StopAsyncIteration:
            return


async def _wait_disconnect(receive: Callable[..., Any]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _read_body(receive: Callable[..., Any], limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    more = True
    while more and size < limit:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        more = message.get("more_body", False)
    return b"".join(chunks)[:limit]


async def _lifespan(receive: Callable[..., Any], send: Callable[..., Any]) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _send(send: Callable[..., Any], status: int, body: bytes, content_type: bytes,
                headers: list[tuple[bytes, bytes]] = ()) -> None:  # type: ignore[assignment]
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _send_json(send: Callable[..., Any], status: int, data: dict[str, Any]) -> None:
    await _send(send, status, json.dumps(data).encode(), b"application/json")
