"""Bad input answers 400/404/405/413 with OpenAI's error JSON, never a 5xx, and never hurts the worker."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from .live import CHAT, Live

MODEL = "tiny-llama"
GOOD: dict[str, Any] = {"model": MODEL, "messages": CHAT, "max_tokens": 4, "temperature": 0}


def chat_with(**changes: Any) -> dict[str, Any]:
    body = {**GOOD, **changes}
    return {k: v for k, v in body.items() if v is not ...}


# (case id, body as JSON-able object, raw bytes, or a callable giving kwargs for httpx; expected status; message fragment)
CHAT_CASES: list[tuple[str, Any, int, str]] = [
    ("malformed json", b'{"model": "tiny-llama", "messages": [', 400, "not valid JSON"),
    ("json not an object", b"[1, 2, 3]", 400, "JSON object"),
    ("empty body", b"", 400, "no JSON body"),
    ("invalid utf-8", b'{"model": "tiny-llama", "messages": [{"role": "user", "content": "\xff\xfe"}]}', 400, "UTF-8"),
    (
        "lone surrogate",
        b'{"model": "tiny-llama", "messages": [{"role": "user", "content": "\\ud800"}]}',
        400,
        "unicode",
    ),
    (
        "NaN temperature",
        b'{"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
        400,
        "temperature",
    ),
    ("deeply nested", b'{"model": "tiny-llama", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, ""),
    ("missing messages", chat_with(messages=...), 400, "messages"),
    ("missing model", chat_with(model=...), 400, "model"),
    ("empty messages", chat_with(messages=[]), 400, "messages"),
    ("messages not a list", chat_with(messages="hello"), 400, "messages"),
    ("unknown role", chat_with(messages=[{"role": "wizard", "content": "hi"}]), 400, "role"),
    ("content wrong type", chat_with(messages=[{"role": "user", "content": 42}]), 400, "content"),
    (
        "image content part",
        chat_with(
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}]
        ),
        400,
        "messages",
    ),
    ("message missing role", chat_with(messages=[{"content": "hi"}]), 400, "role"),
    ("max_tokens as string", chat_with(max_tokens="16"), 400, "max_tokens"),
    ("max_tokens negative", chat_with(max_tokens=-1), 400, "max_tokens"),
    ("max_tokens zero", chat_with(max_tokens=0), 400, "max_tokens"),
    ("max_tokens huge", chat_with(max_tokens=10**12), 400, "maximum context length"),
    ("max_tokens bool", chat_with(max_tokens=True), 400, "max_tokens"),
    (
        "prompt over context",
        chat_with(messages=[{"role": "user", "content": "a" * 3000}]),
        400,
        "maximum context length",
    ),
    ("temperature too high", chat_with(temperature=3), 400, "temperature"),
    ("temperature as string", chat_with(temperature="hot"), 400, "temperature"),
    ("top_p zero", chat_with(top_p=0), 400, "top_p"),
    ("seed negative", chat_with(seed=-5), 400, "seed"),
    ("seed float", chat_with(seed=1.5), 400, "seed"),
    ("stream as string", chat_with(stream="yes"), 400, "stream"),
    ("stop empty string", chat_with(stop=""), 400, "stop"),
    ("too many stops", chat_with(stop=["a", "b", "c", "d", "e"]), 400, "stop"),
    ("n above 1", chat_with(n=2), 400, "n=2"),
    ("unknown field", chat_with(frobnicate=True), 400, "Unrecognized request argument"),
    ("logprobs", chat_with(logprobs=True), 400, "logprobs"),
    ("tools", chat_with(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tools"),
    ("stream_options without stream", chat_with(stream_options={"include_usage": True}), 400, "stream_options"),
    ("max_tokens disagree", chat_with(max_tokens=4, max_completion_tokens=5), 400, "disagree"),
    ("lookahead window zero", chat_with(lookahead={"window": 0}), 400, "window"),
    ("lookahead unknown key", chat_with(lookahead={"depth": 3}), 400, "depth"),
    ("lookahead context_tokens zero", chat_with(lookahead={"context_tokens": 0}), 400, "context_tokens"),
    ("lookahead context_tokens too big", chat_with(lookahead={"guesses": 16, "context_tokens": 64}), 400, "512"),
    ("lookahead too big", chat_with(lookahead={"window": 64, "ngram": 16, "guesses": 64}), 400, "512"),
    ("metadata class invalid", chat_with(metadata={"request_class": "no spaces allowed"}), 400, "request class"),
    ("metadata not strings", chat_with(metadata={"request_class": 3}), 400, "metadata"),
]

COMPLETION_CASES: list[tuple[str, Any, int, str]] = [
    ("batch of prompts", {"model": MODEL, "prompt": ["a", "b"], "max_tokens": 2}, 400, "batch of 2 prompts"),
    ("empty prompt", {"model": MODEL, "prompt": "   ", "max_tokens": 2}, 400, "empty"),
    ("token id out of range", {"model": MODEL, "prompt": [1, 2, 10**9], "max_tokens": 2}, 400, "out of range"),
    ("negative token id", {"model": MODEL, "prompt": [1, -2], "max_tokens": 2}, 400, "prompt"),
    ("prompt wrong type", {"model": MODEL, "prompt": {"text": "hi"}, "max_tokens": 2}, 400, "prompt"),
    ("echo", {"model": MODEL, "prompt": "hi", "max_tokens": 2, "echo": True}, 400, "echo"),
    ("best_of", {"model": MODEL, "prompt": "hi", "max_tokens": 2, "best_of": 3}, 400, "best_of"),
]


def assert_openai_error(response: Any, status: int, fragment: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert fragment in error["message"], error["message"]


def send(http: Any, path: str, body: Any, headers: dict[str, str] | None = None) -> Any:
    if isinstance(body, bytes):
        return http.post(path, content=body, headers={"content-type": "application/json", **(headers or {})})
    return http.post(path, json=body, headers=headers)


@pytest.fixture(scope="module")
def http(live: Live) -> Iterator[Any]:
    with live.http() as client:
        yield client
    # After the whole suite the worker is alive and answers a good request.
    with live.http() as client:
        assert client.get("/health").json() == {"status": "ok"}
        assert client.post("/v1/chat/completions", json=GOOD).status_code == 200


@pytest.mark.parametrize(("case", "body", "status", "fragment"), CHAT_CASES, ids=[c[0] for c in CHAT_CASES])
def test_chat_bad_input(http: Any, case: str, body: Any, status: int, fragment: str) -> None:
    assert_openai_error(send(http, "/v1/chat/completions", body), status, fragment)


@pytest.mark.parametrize(("case", "body", "status", "fragment"), COMPLETION_CASES, ids=[c[0] for c in COMPLETION_CASES])
def test_completion_bad_input(http: Any, case: str, body: Any, status: int, fragment: str) -> None:
    assert_openai_error(send(http, "/v1/completions", body), status, fragment)


def test_wrong_model_is_404_and_names_the_served_model(http: Any) -> None:
    response = send(http, "/v1/chat/completions", chat_with(model="gpt-4o"))
    assert_openai_error(response, 404, "tiny-llama")
    assert response.json()["error"]["code"] == "model_not_found"
    # A model path is not a way to load another model either.
    assert send(http, "/v1/completions", {"model": "/etc/passwd", "prompt": "x"}).status_code == 404


def test_wrong_content_type(http: Any) -> None:
    r = http.post("/v1/chat/completions", content=json.dumps(GOOD), headers={"content-type": "text/plain"})
    assert_openai_error(r, 400, "JSON object")


def test_invalid_request_class_header(http: Any) -> None:
    assert_openai_error(send(http, "/v1/chat/completions", GOOD, {"X-Request-Class": "a b"}), 400, "request class")


def test_ten_megabyte_body_is_413(http: Any) -> None:
    huge = chat_with(messages=[{"role": "user", "content": "x" * (10 * 1024 * 1024)}])
    assert_openai_error(send(http, "/v1/chat/completions", huge), 413, "larger than")


def test_streamed_body_over_the_limit_is_413(http: Any) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer encoding
        yield b'{"model": "tiny-llama", "messages": [{"role": "user", "content": "'
        for _ in range(40):
            yield b"y" * 65536
        yield b'"}]}'

    assert_openai_error(http.post("/v1/chat/completions", content=chunks()), 413, "larger than")


def test_unknown_route_and_wrong_method(http: Any) -> None:
    assert_openai_error(http.get("/v1/nothing"), 404, "no route")
    assert_openai_error(http.get("/v1/chat/completions"), 405, "not allowed")


def test_bad_input_is_counted_as_rejected(live: Live, http: Any) -> None:
    assert send(http, "/v1/chat/completions", GOOD, {"X-Request-Class": "code"}).status_code == 200
    send(http, "/v1/chat/completions", chat_with(n=3), {"X-Request-Class": "code"})
    send(http, "/v1/chat/completions", chat_with(n=3), {"X-Request-Class": "never-served"})
    metrics = http.get("/metrics").text
    assert 'lookahead_rejected_requests_total{reason="invalid_value",request_class="code"} 1.0' in metrics
    # A class seen only on refused requests does not take one of the bounded label slots.
    assert 'lookahead_rejected_requests_total{reason="invalid_value",request_class="other"} 1.0' in metrics
    assert "never-served" not in metrics
