"""`lookahead serve --ray` end to end: a local Ray instance, two engine replicas of the tiny model, plus
one replica pinned to a class of its own, behind the ingress; compared with the single-process server.

One Ray application serves the whole module (starting one costs ~30 s on two cores); the failure test
runs last because it kills a replica (and checks that Ray puts one back).
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

pytest.importorskip("ray", reason="the [ray] extra is part of `make setup`")

import ray  # noqa: E402
from ray import serve  # noqa: E402

import lookahead  # noqa: E402
from lookahead.cluster.bridge import REPLICA_HEADER  # noqa: E402
from lookahead.cluster.config import ClassReplicas, ClusterConfig  # noqa: E402
from lookahead.cluster.launch import deploy  # noqa: E402
from lookahead.cluster.replica import ReplicaSpec  # noqa: E402
from lookahead.server import ServerConfig  # noqa: E402
from lookahead.testing import hold_steps_while  # noqa: E402

from ..server.live import free_port, serve as serve_single  # noqa: E402

KEY = "sk-cluster-test"
MODEL = "tiny-llama"
PINNED = "pinned"  # a class with a replica of its own


@pytest.fixture(scope="module")
def hold(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """While this file exists, every replica's decoding passes wait (lookahead.testing.hold_steps_while)."""
    return tmp_path_factory.mktemp("cluster") / "hold"


@pytest.fixture(scope="module")
def config() -> ServerConfig:
    return ServerConfig(api_key=KEY, adaptive=False, max_queue=32)


@pytest.fixture(scope="module")
def cluster(config: ServerConfig, hold: Path) -> Iterator[str]:
    """The Ray application's URL. Ray gets 4 logical CPUs on 2 cores: 3 one-thread replicas fit."""
    port = free_port()
    ray.init(num_cpus=4, include_dashboard=False, logging_level="warning", _metrics_export_port=free_port(),
             _system_config={"metrics_report_interval_ms": 1000})
    try:
        spec = ReplicaSpec(model="tiny:llama", dtype="float32", config=config, threads=1,
                           setup=functools.partial(hold_steps_while, str(hold)), metrics_interval_s=0.5)
        layout = ClusterConfig(replicas=2, threads=1, class_replicas=(ClassReplicas(PINNED, 1),),
                               health_check_period_s=1.0)
        deploy(spec, layout, host="127.0.0.1", port=port)
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def reference(config: ServerConfig) -> Iterator[str]:
    """The single-process server on the same tiny model and settings."""
    with serve_single(lookahead.load("tiny:llama"), config) as live:
        yield live.url


def client(url: str, **kwargs: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=KEY, timeout=120, **{"max_retries": 0, **kwargs})


def http(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {KEY}"})


REQUESTS: list[dict[str, Any]] = [
    {"prompt": "def fib(n):", "max_tokens": 24, "temperature": 0},  # greedy (OpenAI's default is 1)
    {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0.9, "seed": 7},  # seeded sampling
    {"prompt": "the cat sat on the mat, the cat sat on", "max_tokens": 24, "temperature": 0.7, "top_p": 0.9,
     "seed": 3},
]
CHAT = {"messages": [{"role": "user", "content": "Say something about apples."}], "max_tokens": 24,
        "temperature": 0.8, "seed": 11}


def completion_text(url: str, body: dict[str, Any], stream: bool) -> str:
    c = client(url)
    if not stream:
        return c.completions.create(model=MODEL, **body).choices[0].text
    return "".join(chunk.choices[0].text for chunk in c.completions.create(model=MODEL, stream=True, **body)
                   if chunk.choices)


def chat_text(url: str, stream: bool) -> str:
    c = client(url)
    if not stream:
        return c.chat.completions.create(model=MODEL, **CHAT).choices[0].message.content or ""
    return "".join(chunk.choices[0].delta.content or "" for chunk in c.chat.completions.create(
        model=MODEL, stream=True, **CHAT) if chunk.choices)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_replicas_answer_as_the_single_process_server(cluster: str, reference: str, stream: bool) -> None:
    for body in REQUESTS:
        assert completion_text(cluster, body, stream) == completion_text(reference, body, stream), body
    assert chat_text(cluster, stream) == chat_text(reference, stream)


def test_requests_land_on_both_replicas(cluster: str) -> None:
    """Ray Serve's router spreads concurrent requests; each answer names its replica."""
    seen: list[str] = []

    def one(i: int) -> None:
        with http(cluster) as h:
            r = h.post("/v1/completions", json={"model": MODEL, "prompt": f"request {i}", "max_tokens": 8})
            assert r.status_code == 200, r.text
            seen.append(r.headers[REPLICA_HEADER])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 12 and len(set(seen)) == 2, seen  # two Engine replicas (the pinned one gets no class)


def test_a_class_with_its_own_replica_goes_there(cluster: str) -> None:
    with http(cluster) as h:
        general = {h.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2}
                          ).headers[REPLICA_HEADER] for _ in range(6)}
        by_header = {h.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2},
                            headers={"X-Request-Class": PINNED}).headers[REPLICA_HEADER] for _ in range(4)}
        by_body = {h.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2,
                                                    "metadata": {"request_class": PINNED}}).headers[REPLICA_HEADER]
                   for _ in range(2)}
    assert len(by_header) == 1 and by_header == by_body
    assert not by_header & general


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, None),
        (json.dumps({"model": MODEL}).encode(), 400, None),  # no prompt
        (json.dumps({"model": "nope", "prompt": "x"}).encode(), 404, "model_not_found"),
        (json.dumps({"model": MODEL, "prompt": "x", "max_tokens": -1}).encode(), 400, None),
        (json.dumps({"model": MODEL, "prompt": "x", "metadata": {"request_class": "bad class!"}}).encode(), 400,
         "invalid_request_class"),
        (b"x" * (2 * 1024 * 1024 + 10), 413, None),
    ],
    ids=["bad-json", "no-prompt", "unknown-model", "negative-max-tokens", "bad-class", "too-large"],
)
def test_bad_input_is_a_4xx_in_openai_shape(cluster: str, body: bytes, status: int, code: str | None) -> None:
    with http(cluster) as h:
        r = h.post("/v1/completions", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["message"] and (code is None or error["code"] == code)


def test_auth_health_models_and_policy(cluster: str) -> None:
    with httpx.Client(base_url=cluster, timeout=60) as h:
        assert h.post("/v1/completions", json={"model": MODEL, "prompt": "x"}).status_code == 401
        assert h.get("/metrics").status_code == 401
        health = h.get("/health")  # open, like the single-process server's
    assert health.status_code == 200
    assert health.json()["replicas"]["deployments"] == {"Engine": {"RUNNING": 2}, f"Engine-{PINNED}": {"RUNNING": 1}}
    with http(cluster) as h:
        assert h.get("/v1/models").json()["data"][0]["id"] == MODEL
        assert h.get("/v1/policy").json()["object"] == "policy"


def test_metrics_of_every_replica_under_the_server_names(cluster: str) -> None:
    with http(cluster) as h:
        for _ in range(4):
            assert h.post("/v1/completions", json={"model": MODEL, "prompt": "m", "max_tokens": 4}).status_code == 200
        deadline = time.monotonic() + 60
        replicas: set[str] = set()
        while time.monotonic() < deadline and len(replicas) < 3:
            text = h.get("/metrics").text
            replicas = {line.split('replica="')[1].split('"')[0] for line in text.splitlines()
                        if line.startswith("lookahead_requests_total{")}
            time.sleep(0.5)
    assert len(replicas) >= 2, text  # the Engine replicas have served requests by now
    assert "lookahead_batch_size{" in text and "lookahead_kv_tokens{" in text


def test_a_killed_replica_fails_only_its_own_requests_and_is_replaced(cluster: str, reference: str,
                                                                    hold: Path) -> None:
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0.9, "seed": 7}
    expected = completion_text(reference, {k: v for k, v in body.items() if k != "model"}, stream=False)
    with http(cluster) as h:
        before = set(h.get("/health").json()["replicas"]["deployments"])
    hold.touch()  # from now on, admitted requests wait before their first pass
    statuses: dict[int, httpx.Response] = {}

    def whole(i: int) -> None:
        with http(cluster) as h:
            statuses[i] = h.post("/v1/completions", json=body)

    try:
        with http(cluster) as h, h.stream("POST", "/v1/completions", json={**body, "stream": True}) as stream:
            victim = stream.headers[REPLICA_HEADER]  # the stream's headers come before any pass
            workers = [threading.Thread(target=whole, args=(i,)) for i in range(6)]
            for t in workers:
                t.start()
            _wait_in_flight(h, 7)
            ray.kill(_actor_of(victim), no_restart=True)
            lines = list(stream.iter_lines())
        # The stream that was on the killed replica ends with an OpenAI error event.
        events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        assert events and events[-1]["error"]["code"] == "replica_unavailable", lines
    finally:
        hold.unlink()
    for t in workers:
        t.join(120)
    # Requests on the killed replica got a 503 to retry; all others finished as usual.
    for r in statuses.values():
        assert r.status_code in (200, 503), r.text
        if r.status_code == 503:
            assert r.json()["error"]["code"] == "replica_unavailable" and r.headers["Retry-After"]
        else:
            assert r.json()["choices"][0]["text"] == expected
    # Retried, and sent afterwards: every request succeeds (an OpenAI client retries the 503 itself).
    retrying = client(cluster, max_retries=3)
    for _ in range(6):
        assert retrying.completions.create(**body).choices[0].text == expected
    # Ray puts a new replica in the dead one's place.
    deadline = time.monotonic() + 120
    with http(cluster) as h:
        while time.monotonic() < deadline:
            health = h.get("/health").json()
            if health["replicas"]["deployments"].get("Engine") == {"RUNNING": 2}:
                break
            time.sleep(0.5)
        assert health["replicas"]["deployments"]["Engine"] == {"RUNNING": 2}, health
        assert set(health["replicas"]["deployments"]) == before
        after = {h.post("/v1/completions", json={**body, "max_tokens": 2}).headers[REPLICA_HEADER] for _ in range(12)}
    assert victim not in after


def _actor_of(replica: str) -> Any:
    """The Ray actor of the Engine replica with this id (Ray Serve names replica actors by app,
    deployment and replica id)."""
    return ray.get_actor(f"SERVE_REPLICA::lookahead#Engine#{replica}", namespace="serve")


def _wait_in_flight(h: httpx.Client, n: int) -> None:
    """Wait until `n` requests are on the replicas, in a batch or queued (the hold keeps them there: a
    replica's worker waits in its first pass, so later arrivals wait in its queue)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = h.get("/metrics").text
        running = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()  # running or queued
                      if line.startswith(("lookahead_in_flight{", "lookahead_queue_depth{")))
        if running >= n:
            return
        time.sleep(0.1)
    raise AssertionError(f"{n} requests never got in flight")
