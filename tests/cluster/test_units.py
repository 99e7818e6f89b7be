"""The cluster's parts without a Ray cluster: the layout config, ASGI over a handle (both sides, with a
fake handle whose replica fails on cue) and reading Ray's metrics export back under our names."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from lookahead.cluster.bridge import ACCEPTED, REPLICA_HEADER, run_asgi, wire_scope
from lookahead.cluster.config import ClassReplicas, ClusterConfig, parse_class_replicas
from lookahead.cluster.metrics import lookahead_samples, node_metrics_urls
from lookahead.errors import ConfigError

ray_exceptions = pytest.importorskip("ray.exceptions")
from ray.serve.exceptions import BackPressureError  # noqa: E402

from lookahead.cluster.ingress import IngressApp  # noqa: E402

# -- the layout --------------------------------------------------------------------------------------


def test_class_replicas_parse_and_route() -> None:
    layout = ClusterConfig(replicas=2, class_replicas=parse_class_replicas("chat=1, code=3"))
    assert layout.class_replicas == (ClassReplicas("chat", 1), ClassReplicas("code", 3))
    assert layout.total_replicas == 6
    assert layout.routes() == {"chat": "Engine-chat", "code": "Engine-code"}
    assert parse_class_replicas("") == ()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"replicas": 0}, "replicas must be an integer >= 1"),
        ({"min_replicas": 1}, "give both --min-replicas and --max-replicas"),
        ({"replicas": 5, "min_replicas": 1, "max_replicas": 4}, "must lie within"),
        ({"class_replicas": (ClassReplicas("a b", 1),)}, "is not a class name"),
        ({"class_replicas": (ClassReplicas("a", 1), ClassReplicas("a", 2))}, "given twice"),
        ({"class_replicas": (ClassReplicas("a", 0),)}, "replicas must be an integer >= 1"),
        ({"address": " "}, "Ray address is empty"),
        ({"health_check_period_s": 0}, "health check period"),
        ({"threads": 0}, "threads must be an integer >= 1"),
    ],
)
def test_bad_layouts_are_refused_with_what_to_do(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ClusterConfig(**kwargs)


@pytest.mark.parametrize("text", ["chat", "chat=x", "=2", "chat=-1"])
def test_bad_class_replicas_text(text: str) -> None:
    with pytest.raises(ConfigError):
        ClusterConfig(class_replicas=parse_class_replicas(text))


# -- the engine side: one request through an ASGI app --------------------------------------------------

def _app(seen: dict[str, Any]) -> FastAPI:
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, Any]:
        return {"body": (await request.body()).decode(), "path": request.url.path}

    @app.get("/stream")
    async def stream(request: Request) -> StreamingResponse:
        async def lines() -> AsyncIterator[str]:
            try:  # the app stops its stream when receive() says http.disconnect
                for i in range(1000):
                    yield f"line {i}\n"
                    await asyncio.sleep(0.01)
                seen["finished"] = True
            finally:
                seen["closed"] = True
        return StreamingResponse(lines(), media_type="text/plain")

    return app


def _scope(method: str, path: str) -> dict[str, Any]:
    return wire_scope({"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
                       "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
                       "root_path": "/ignored", "headers": [(b"host", b"x")], "server": ["x", 80],
                       "client": ["127.0.0.1", 5], "app": object()})


def test_run_asgi_yields_the_apps_messages_with_extra_headers() -> None:
    async def go() -> list[dict[str, Any]]:
        return [m async for m in run_asgi(_app({}), _scope("POST", "/echo"), b"hello",
                                          headers=[(REPLICA_HEADER.encode(), b"r1")])]

    messages = asyncio.run(go())
    start, body = messages[0], messages[-1]
    assert start["status"] == 200 and (REPLICA_HEADER.encode(), b"r1") in start["headers"]
    assert json.loads(body["body"]) == {"body": "hello", "path": "/echo"}
    assert "app" not in _scope("GET", "/x") and _scope("GET", "/x")["root_path"] == ""


def test_a_consumer_that_stops_early_is_a_client_that_went_away() -> None:
    """The server app cancels decoding on http.disconnect; a cancelled relay must deliver one."""
    seen: dict[str, Any] = {}

    async def go() -> None:
        stream = run_asgi(_app(seen), _scope("GET", "/stream"), b"")
        async for message in stream:
            if message["type"] == "http.response.body":
                break
        await stream.aclose()
        for _ in range(200):
            if seen.get("disconnected"):
                return
            await asyncio.sleep(0.005)

    asyncio.run(go())
    assert seen.get("closed") is True and "finished" not in seen


# -- the ingress side: a fake handle whose replica fails on cue ---------------------------------------

START_JSON = {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}
START_SSE = {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}


def body(data: bytes, more: bool = False) -> dict[str, Any]:
    return {"type": "http.response.body", "body": data, "more_body": more}


class FakeStream:
    """One handle call: yields its script; an exception in the script is raised at that point."""

    def __init__(self, script: list[Any]) -> None:
        self._script = list(script)
        self.cancelled = False

    def __aiter__(self) -> FakeStream:
        return self

    async def __anext__(self) -> dict[str, Any]:
        if not self._script:
            raise StopAsyncIteration
        item = self._script.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item

    def cancel(self) -> None:
        self.cancelled = True


class FakeHandle:
    """A deployment handle whose successive calls follow `scripts` (one list per call)."""

    def __init__(self, *scripts: list[Any]) -> None:
        self.scripts = list(scripts)
        self.calls: list[tuple[dict[str, Any], bytes]] = []
        self.asgi = self

    def options(self, **_: Any) -> FakeHandle:
        return self

    def remote(self, scope: dict[str, Any], data: bytes) -> FakeStream:
        self.calls.append((scope, data))
        return FakeStream(self.scripts.pop(0))


def ingress(handles: dict[str, FakeHandle], routes: dict[str, str] | None = None,
            states: dict[str, dict[str, int]] | None = None) -> httpx.AsyncClient:
    app = IngressApp(handles, routes or {}, "Engine", health=lambda: states or {"Engine": {"RUNNING": 2}},
                     metrics=lambda: "lookahead_x 1\n", max_body_bytes=1024)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def post(handles: dict[str, FakeHandle], **kwargs: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        async with ingress(handles, kwargs.pop("routes", None)) as c:
            return await c.post("/v1/completions", **kwargs)

    return asyncio.run(go())


def test_a_replica_that_died_before_taking_the_request_is_skipped() -> None:
    # Call 1: the replica is gone before it yields ACCEPTED: nothing ran, so the ingress sends it again.
    handle = FakeHandle([ray_exceptions.ActorDiedError()], [{"type": ACCEPTED}, START_JSON, body(b'{"ok": 1}')])
    r = post({"Engine": handle}, content=b'{"prompt": "x"}')
    assert r.status_code == 200 and r.json() == {"ok": 1}
    assert len(handle.calls) == 2 and handle.calls[1][1] == b'{"prompt": "x"}'


def test_a_replica_that_died_while_running_the_request_gives_a_503_to_retry() -> None:
    # ACCEPTED came first: the request may have run; it is the client's to retry, not ours.
    handle = FakeHandle([{"type": ACCEPTED}, ray_exceptions.ActorDiedError()])
    r = post({"Engine": handle}, content=b"{}")
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["code"] == "replica_unavailable" and r.json()["error"]["type"] == "server_error"
    assert len(handle.calls) == 1


def test_a_stream_cut_by_a_dying_replica_ends_with_an_error_event() -> None:
    handle = FakeHandle([{"type": ACCEPTED}, START_SSE, body(b'data: {"a": 1}\n\n', more=True),
                         ray_exceptions.ActorDiedError()])
    r = post({"Engine": handle}, content=b"{}")
    assert r.status_code == 200
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[0] == {"a": 1} and events[-1]["error"]["code"] == "replica_unavailable"


def test_rays_queue_limit_is_a_429_and_other_failures_a_500() -> None:
    busy = FakeHandle([BackPressureError(num_queued_requests=9, max_queued_requests=8)])
    r = post({"Engine": busy}, content=b"{}")
    assert r.status_code == 429 and r.json()["error"]["code"] == "replicas_busy"
    broken = FakeHandle([{"type": ACCEPTED}, RuntimeError("boom")])
    r = post({"Engine": broken}, content=b"{}")
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"


def test_a_replica_that_keeps_dying_before_taking_it_ends_in_a_503() -> None:
    handle = FakeHandle(*([ray_exceptions.ActorDiedError()] for _ in range(4)))
    r = post({"Engine": handle}, content=b"{}")
    assert r.status_code == 503 and len(handle.calls) == 4


def test_requests_go_to_their_class_deployment() -> None:
    ok = [{"type": ACCEPTED}, START_JSON, body(b"{}")]
    general, pinned = FakeHandle(ok, ok, ok), FakeHandle(ok, ok)
    handles = {"Engine": general, "Engine-chat": pinned}
    routes = {"chat": "Engine-chat"}
    post(handles, routes=routes, content=b"{}", headers={"X-Request-Class": "chat"})
    post(handles, routes=routes, content=json.dumps({"metadata": {"request_class": "chat"}}).encode())
    post(handles, routes=routes, content=json.dumps({"metadata": {"request_class": "code"}}).encode())
    post(handles, routes=routes, content=b"not json")
    post(handles, routes=routes, content=json.dumps({"metadata": "odd"}).encode())
    assert len(pinned.calls) == 2 and len(general.calls) == 3


def test_health_and_metrics_are_answered_by_the_ingress() -> None:
    async def go(states: dict[str, dict[str, int]]) -> tuple[httpx.Response, httpx.Response]:
        async with ingress({}, states=states) as c:
            return await c.get("/health"), await c.get("/metrics")

    health, metrics = asyncio.run(go({"Engine": {"RUNNING": 2}, "Engine-chat": {"RUNNING": 1}}))
    assert health.status_code == 200 and health.json()["replicas"]["running"] == 3
    assert metrics.text == "lookahead_x 1\n"
    health, _ = asyncio.run(go({"Engine": {"RUNNING": 1}, "Engine-chat": {"STARTING": 1}}))
    assert health.status_code == 503


# -- Ray's metrics export, read back ------------------------------------------------------------------

RAY_EXPORT = """\
# HELP ray_lookahead_requests_total Requests
# TYPE ray_lookahead_requests_total gauge
ray_lookahead_requests_total{Component="core_worker",NodeAddress="10.0.0.1",SessionName="s",Version="2.60.0",\
WorkerId="ab",otel_scope_name="x",replica="r1",request_class="code",status="ok",strategy="lookahead"} 3.0
ray_lookahead_kv_tokens{Component="core_worker",replica="r2"} 17.0
ray_node_cpu_utilization{NodeAddress="10.0.0.1"} 50.0
lookahead_not_from_ray 1
"""


def test_ray_export_is_read_back_under_the_server_names() -> None:
    assert lookahead_samples(RAY_EXPORT) == [
        'lookahead_kv_tokens{replica="r2"} 17.0',
        'lookahead_requests_total{replica="r1",request_class="code",status="ok",strategy="lookahead"} 3.0',
    ]


def test_metrics_urls_of_alive_nodes_only() -> None:
    nodes = [{"Alive": True, "NodeManagerAddress": "10.0.0.1", "MetricsExportPort": 9000},
             {"Alive": False, "NodeManagerAddress": "10.0.0.2", "MetricsExportPort": 9000}]
    assert node_metrics_urls(nodes) == ["http://10.0.0.1:9000/metrics"]


# -- the application layout (built, not deployed: binding needs no Ray instance) ----------------------

def test_build_app_lays_out_engines_ingress_threads_and_autoscaling() -> None:
    from lookahead.cluster.launch import build_app
    from lookahead.cluster.replica import ReplicaSpec
    from lookahead.server import ServerConfig

    spec = ReplicaSpec(model="tiny:llama", dtype="float32", config=ServerConfig(max_batch=4, max_queue=6))
    layout = ClusterConfig(replicas=2, min_replicas=1, max_replicas=4, class_replicas=(ClassReplicas("chat", 1),))
    ingress = build_app(spec, layout, cpus=9)._bound_deployment
    handles, routes = ingress.init_args[0], ingress.init_args[1]
    assert ingress.name == "Ingress" and ingress.ray_actor_options["num_cpus"] == 0
    assert routes == {"chat": "Engine-chat"}
    engine, chat = handles["Engine"]._bound_deployment, handles["Engine-chat"]._bound_deployment
    # Autoscaling on requests in flight, aimed at a full batch; starting at --replicas.
    scaling = engine._deployment_config.autoscaling_config
    assert (scaling.min_replicas, scaling.max_replicas, scaling.initial_replicas) == (1, 4, 2)
    assert scaling.target_ongoing_requests == 4
    assert chat.num_replicas == 1 and chat._deployment_config.autoscaling_config is None
    # Ray hands a replica what it would accept itself (batch + queue); threads: (9 cores - 1) // 3 replicas.
    assert engine.max_ongoing_requests == 10
    assert engine.init_args[0].threads == 2 and engine.ray_actor_options["num_cpus"] == 2
