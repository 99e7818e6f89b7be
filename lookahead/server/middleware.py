"""Pure ASGI middleware: bearer-token auth (constant time) and a request body size limit."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable, Mapping
from typing import Any

from lookahead.server.errors import error_body

Scope = dict[str, Any]
ASGIApp = Callable[..., Any]

OPEN_PATHS = frozenset({"/health"})


async def send_error(
    send: Callable[..., Any], status: int, body: dict[str, Any], headers: tuple[tuple[bytes, bytes], ...] = ()
) -> None:
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value)
    return None


class AuthMiddleware:
    """Every path but /health needs `Authorization: Bearer KEY` with one of the keys; otherwise 401 in
    OpenAI's shape. An accepted request carries its key's n-gram cache classes in
    scope["state"]["cache_classes"] (a frozenset; "*" = all)."""

    def __init__(
        self,
        app: ASGIApp,
        keys: Mapping[str, frozenset[str]],
        on_reject: Callable[[Scope], None] | None = None,
    ) -> None:
        self.app = app
        self._keys = [(hashlib.sha256(key.encode()).digest(), classes) for key, classes in keys.items()]
        self._on_reject = on_reject

    def classes_of(self, scope: Scope) -> frozenset[str] | None:
        """The cache classes of the key the request carries, or None when it carries no valid key."""
        header = _header(scope, b"authorization") or b""
        scheme, _, token = header.strip().partition(b" ")
        # Hash both sides so each comparison is constant time and does not leak a key's length; compare
        # with every key, so the time does not tell which one matched either.
        given = hashlib.sha256(token.strip()).digest()
        found: frozenset[str] | None = None
        for digest, classes in self._keys:
            if hmac.compare_digest(given, digest):
                found = classes
        return found if scheme.lower() == b"bearer" else None

    async def __call__(self, scope: Scope, receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        classes = self.classes_of(scope)
        if classes is not None:
            scope.setdefault("state", {})["cache_classes"] = classes
            await self.app(scope, receive, send)
            return
        if self._on_reject is not None:
            self._on_reject(scope)
        await send_error(
            send,
            401,
            error_body(
                "Incorrect or missing API key: send the header 'Authorization: Bearer <key>' with the key the "
                "server was started with (--api-key, LOOKAHEAD_API_KEY or --api-keys)",
                param=None,
                code="invalid_api_key",
            ),
            ((b"www-authenticate", b"Bearer"),),
        )


class BodyLimitMiddleware:
    """Refuse request bodies over `limit` bytes with 413, whether announced by Content-Length or streamed."""

    def __init__(self, app: ASGIApp, limit: int, on_reject: Callable[[Scope], None] | None = None) -> None:
        self.app = app
        self.limit = limit
        self._on_reject = on_reject

    async def _too_large(self, scope: Scope, send: Callable[..., Any]) -> None:
        if self._on_reject is not None:
            self._on_reject(scope)
        await send_error(
            send,
            413,
            error_body(
                f"the request body is larger than this server's limit of {self.limit} bytes; "
                "send a shorter prompt (or start the server with a larger limit)",
                code="body_too_large",
            ),
            ((b"connection", b"close"),),
        )

    async def __call__(self, scope: Scope, receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                await send_error(
                    send, 400, error_body("the Content-Length header is not a number", code="invalid_body")
                )
                return
            if size > self.limit:
                await self._too_large(scope, send)
                return
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before sending its body
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.limit:
                await self._too_large(scope, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            message: dict[str, Any] = await receive()
            return message

        await self.app(scope, replay, send)
