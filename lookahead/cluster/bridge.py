"""ASGI over a Ray Serve handle: the ingress hands an HTTP request to an engine replica, which runs it
through the single-process server app (lookahead/server/app.py) and streams the ASGI messages back.

The engine side is `run_asgi`; the ingress side is `wire_scope` plus the messages it relays. Nothing
here imports Ray: a test drives both sides with plain coroutines.

The message stream, engine -> ingress:
    {"type": ACCEPTED}                      the replica took the request (before any model work)
    {"type": "http.response.start", ...}    status and headers (the replica's id among them)
    {"type": "http.response.body", ...}     one or more, the last with more_body False
The ACCEPTED marker is how the ingress tells "the replica died before it took the request" (safe to
send elsewhere) from "it died while running it" (the client gets a 503 it may retry).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

ACCEPTED = "lookahead.accepted"
REPLICA_HEADER = "x-lookahead-replica"
_SCOPE_KEYS = ("type", "asgi", "http_version", "method", "scheme", "path", "raw_path", "query_string", "root_path",
               "headers", "server", "client")


def wire_scope(scope: dict[str, Any]) -> dict[str, Any]:
    """The picklable part of an HTTP scope, as the engine's app needs it (no app/router/state objects)."""
    out = {k: scope[k] for k in _SCOPE_KEYS if k in scope}
    out["headers"] = [(bytes(k), bytes(v)) for k, v in scope.get("headers", [])]
    out["root_path"] = ""  # the engine app sees the path as the client sent it
    for key in ("server", "client"):
        if out.get(key) is not None:
            out[key] = tuple(out[key])
    return out


async def run_asgi(app: Any, scope: dict[str, Any], body: bytes, *,
                   headers: Sequence[tuple[bytes, bytes]] = ()) -> AsyncIterator[dict[str, Any]]:
    """Run one HTTP request (scope + its whole body) through the ASGI `app` and yield what it sends.

    `headers` are added to the response start. If the consumer stops early (the client went away,
    the ingress cancelled), the app's next receive() returns http.disconnect, which is how the
    server app cancels the request's decoding (lookahead/server/app.py, _watch_disconnect)."""
    sent: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    gone = asyncio.Event()
    body_given = False

    async def receive() -> dict[str, Any]:
        nonlocal body_given
        if not body_given:
            body_given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *headers]}
        await sent.put(message)

    async def run() -> None:
        try:
            await app(dict(scope), receive, send)
        finally:
            await sent.put(None)

    task = asyncio.create_task(run())
    finished = False
    try:
        while True:
            message = await sent.get()
            if message is None:  # the app returned (or raised: re-raised below)
                break
            yield message
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                finished = True
                break
        if not finished:
            await task  # re-raises what the app raised
            raise RuntimeError("the server app returned without a complete response")
    finally:
        gone.set()  # a consumer that stopped early is a client that went away
        if finished or task.done():
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(task, timeout=5.0)
