"""The batched worker (server/batch_worker.py): concurrent requests share forward passes, each gets
what it gets alone, a disconnect frees its slot, and the KV budget turns excess load into 429s."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import httpx
import pytest

import lookahead
from lookahead.config import SamplingConfig
from lookahead.policy import Decision
from lookahead.scheduler.scheduler import SchedulerConfig
from lookahead.server import ServerConfig
from lookahead.server.batch_worker import BatchWorker
from lookahead.server.errors import APIError
from lookahead.server.metrics import ServerMetrics
from lookahead.server.worker import Job, JobSpec

from .live import serve

MODEL = "tiny-llama"
PROMPTS = ["Tell me a story.", "List three colours.", "abc abc abc abc", "What is 2 + 2?", "Say hello.",
           "Write a haiku about lookahead decoding."]


def metric(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def test_concurrent_requests_share_passes_and_each_equals_its_lone_run() -> None:
    tiny = lookahead.testing.tiny_model("llama", dtype=__import__("torch").float64)  # exact: bit-equal rows
    requests = [(p, SamplingConfig() if i % 2 == 0 else SamplingConfig(temperature=0.8, seed=i))
                for i, p in enumerate(PROMPTS)]
    alone = [lookahead.generate(tiny, [{"role": "user", "content": p}], max_new_tokens=24, sampling=s).text
             for p, s in requests]
    with serve(tiny, ServerConfig(max_batch=4, adaptive=False)) as server:
        client = server.openai()

        def ask(i: int) -> str:
            p, s = requests[i]
            out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": p}],
                                                 max_tokens=24, temperature=s.temperature, seed=s.seed)
            return out.choices[0].message.content or ""

        with ThreadPoolExecutor(len(requests)) as pool:
            answers = list(pool.map(ask, range(len(requests))))
        metrics = server.http().get("/metrics").text
    assert answers == alone
    steps = metric(metrics, "lookahead_decode_steps_total{")
    passes = metric(metrics, "lookahead_batch_steps_total")
    assert 0 < passes < steps, f"{passes} passes for {steps} request steps: the requests never shared a pass"
    assert metric(metrics, "lookahead_step_rows_total") >= steps


def test_a_disconnect_frees_the_slot_and_its_kv() -> None:
    tiny = lookahead.testing.tiny_model("llama")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "go"}], "max_tokens": 900, "stream": True,
            "temperature": 0}
    with serve(tiny, ServerConfig(max_batch=2)) as server:
        with server.http() as http, http.stream("POST", "/v1/chat/completions", json=body) as s:
            lines = s.iter_lines()
            for _ in range(3):
                next(lines)
        assert server.worker_idle(30)
        text = server.http().get("/metrics").text
    assert metric(text, 'lookahead_requests_total{request_class="default",status="disconnect"') == 1
    assert metric(text, "lookahead_kv_tokens") == 0
    assert 0 < metric(text, "lookahead_generated_tokens_total{") < 900


class QuietJob(Job):
    def __init__(self, prompt_tokens: int, max_new_tokens: int) -> None:
        spec = JobSpec(tuple(range(prompt_tokens)), max_new_tokens, Decision("autoregressive"), SamplingConfig(), (),
                       "default")
        super().__init__(spec, cast(asyncio.AbstractEventLoop, None), timeout_s=600)
        self.items: list[Any] = []

    def push(self, item: Any) -> None:
        self.items.append(item)


def test_the_kv_budget_refuses_with_429_and_shutdown_gives_it_back() -> None:
    metrics = ServerMetrics(price_per_hour_usd=0.0, known_classes=[], max_class_labels=4, queue_depth=lambda: 0,
                            in_flight=lambda: 0)
    worker = BatchWorker(object(), metrics, max_queue=8, scheduler=SchedulerConfig(max_batch=2), max_kv_tokens=100)
    worker.submit(QuietJob(20, 40))  # reserves 60 of 100 (the worker thread is not started: it stays queued)
    with pytest.raises(APIError) as refused:
        worker.submit(QuietJob(20, 40))  # 120 > 100
    assert refused.value.status == 429 and refused.value.code == "kv_budget_full"
    assert "Retry-After" in refused.value.headers
    worker.submit(QuietJob(10, 30))  # 100: fits exactly
    worker.cancel_all()
    assert worker._reserved == 0 and worker.queue_depth == 0
