"""schemathesis against the server's own OpenAPI schema: valid and invalid requests, zero 5xx.

Generation is capped at a few tokens per request (the fuzzed surface is HTTP and validation, not the
engine), so the run stays short on two cores.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis  # a declared test dependency (the test extra): a broken install must fail, not skip
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis.generation import GenerationMode

import lookahead
from lookahead.server import ServerConfig

from .live import Live, serve

MODEL = "tiny-llama"

EXAMPLES = {GenerationMode.POSITIVE: 60, GenerationMode.NEGATIVE: 60}  # per POST operation; GETs get 10


def short_stream(loaded: Any, prompt: Any, **kwargs: Any) -> Iterator[Any]:
    kwargs["max_new_tokens"] = min(int(kwargs["max_new_tokens"]), 4)
    return lookahead.stream_events(loaded, prompt, **kwargs)


@pytest.fixture(scope="module")
def fuzz_server(tiny: Any) -> Iterator[Live]:
    with serve(tiny, ServerConfig(max_queue=4, request_timeout_s=20), stream_fn=short_stream) as server:
        yield server


def fuzz(operation: Any, mode: GenerationMode, url: str, failures: list[str]) -> set[int]:
    """Send generated requests to one operation; collect 5xx as failures; return the statuses seen."""
    label = f"{operation.method.upper()} {operation.path}"
    statuses: set[int] = set()

    @given(case=operation.as_strategy(generation_mode=mode), served_model=st.booleans())
    @settings(
        max_examples=EXAMPLES[mode] if operation.method.upper() == "POST" else 10,
        deadline=None,
        database=None,
        derandomize=True,  # the same cases every run: a CI result never depends on the draw
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Any, served_model: bool) -> None:
        if served_model and isinstance(case.body, dict) and "model" in case.body:
            case.body["model"] = MODEL  # half the time, get past the model check to the engine
            if "prompt" in case.body:  # ... and past the prompt check: generated batches are refused
                case.body["prompt"] = "Say hi."
        response = case.call(base_url=url, timeout=30)
        statuses.add(response.status_code)
        if response.status_code >= 500:
            failures.append(f"{label} -> {response.status_code}: {response.text[:300]}\n{case.as_curl_command()}")
        elif response.status_code >= 400:
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}

    try:
        run()
    except Unsatisfiable:  # no invalid input exists for an operation without inputs (GET /health)
        assert mode is GenerationMode.NEGATIVE and operation.method.upper() == "GET"
    return statuses


@pytest.mark.parametrize("mode", list(EXAMPLES), ids=[m.value for m in EXAMPLES])
def test_openapi_fuzzing_never_gets_a_server_error(fuzz_server: Live, mode: GenerationMode) -> None:
    schema = schemathesis.openapi.from_dict(fuzz_server.app.openapi())
    failures: list[str] = []
    statuses = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        statuses[f"{operation.method.upper()} {operation.path}"] = fuzz(operation, mode, fuzz_server.url, failures)
    assert not failures, "\n\n".join(failures[:5])
    posts = ("POST /v1/chat/completions", "POST /v1/completions")
    if mode is GenerationMode.POSITIVE:  # valid requests did reach the model
        assert all(200 in statuses[p] for p in posts), statuses
    else:
        assert all(400 in statuses[p] for p in posts), statuses
    with fuzz_server.http() as http:  # and the worker is still alive
        assert http.get("/health").json() == {"status": "ok"}
