"""OpenAI-shaped errors: {"error": {"message", "type", "param", "code"}}, for every failure path."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("lookahead.server")

INVALID_REQUEST = "invalid_request_error"


class APIError(Exception):
    """An error to send to the client as-is (status, OpenAI error body, optional headers)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(
    message: str, *, type: str = INVALID_REQUEST, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def _param(loc: Sequence[Any]) -> str | None:
    """('body', 'messages', 0, 'role') -> 'messages[0].role'."""
    parts = list(loc[1:] if loc and loc[0] == "body" else loc)
    # Union members show up as loc entries such as 'str', 'constrained-str' or 'list[...]'; skip them.
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif isinstance(p, str) and ("[" in p or "-" in p or p in ("str", "int", "float", "bool", "list", "dict")):
            continue
        else:
            out += ("." if out else "") + str(p)
    return out or None


def validation_error(errors: Sequence[Mapping[str, Any]]) -> APIError:
    """One clear 400 from pydantic/FastAPI validation errors (the first few are listed)."""
    if not errors:
        return bad_request("the request body is invalid")
    first = errors[0]
    kind = first.get("type", "")
    if kind == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return bad_request(
            f"the request body is not valid JSON ({detail}); send a JSON object with Content-Type: application/json",
            code="invalid_json",
        )
    if kind == "extra_forbidden":
        name = _param(first.get("loc", ()))
        return bad_request(
            f"Unrecognized request argument supplied: {name}. See docs/server.md for the supported fields.",
            param=name,
            code="unknown_parameter",
        )
    if kind == "missing" and tuple(first.get("loc", ())) == ("body",):
        return bad_request(
            "the request has no JSON body; send a JSON object with Content-Type: application/json",
            code="missing_body",
        )
    if kind in ("model_attributes_type", "dict_type", "model_type") and tuple(first.get("loc", ())) == ("body",):
        return bad_request(
            "the request body must be a JSON object sent with Content-Type: application/json",
            code="invalid_body",
        )
    messages = []
    for err in errors[:3]:
        name = _param(err.get("loc", ()))
        msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        messages.append(f"{name}: {msg}" if name else msg)
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return bad_request("; ".join(messages) + more, param=_param(first.get("loc", ())), code="invalid_value")


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 400: "invalid_body", 413: "body_too_large"}


def _from_http_error(request: Request, exc: StarletteHTTPException) -> APIError:
    message = str(exc.detail)
    if exc.status_code == 404:
        message = f"no route {request.method} {request.url.path}; see GET /docs for the API"
    elif exc.status_code == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
    elif exc.status_code == 400 and "parsing the body" in message:
        message = "the request body could not be read as UTF-8 JSON; send a UTF-8 encoded JSON object"
    return APIError(exc.status_code, message, code=_HTTP_CODES.get(exc.status_code), headers=exc.headers or None)


def install_error_handlers(app: FastAPI, on_error: Callable[[Request, APIError], None] | None = None) -> None:
    """Every error leaves in OpenAI's shape; `on_error` sees each one (for metrics)."""

    def reply(request: Request, err: APIError) -> JSONResponse:
        if on_error is not None:
            on_error(request, err)
        return err.response()

    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, APIError)
        return reply(request, exc)

    async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return reply(request, validation_error(list(exc.errors())))

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        return reply(request, _from_http_error(request, exc))

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("unexpected error while serving %s %s", request.method, request.url.path, exc_info=exc)
        message = (
            f"internal server error ({type(exc).__name__}); the server is still running. "
            "Please report this with the request that caused it."
        )
        return reply(request, APIError(500, message, type="server_error"))

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)
