"""create_app(): the OpenAI-compatible FastAPI application around one loaded model."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import FastAPI, Header, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from lookahead.candidates.ngram_cache import NGramCaches
from lookahead.engine.prefix_cache import PrefixCache
from lookahead.learned import read_learned, write_learned
from lookahead.server.config import ServerConfig
from lookahead.server.errors import APIError, install_error_handlers
from lookahead.server.metrics import UNLABELLED, ServerMetrics
from lookahead.server.middleware import AuthMiddleware, BodyLimitMiddleware
from lookahead.server.prepare import (
    CLASS_HEADER,
    build_spec,
    check_model,
    encode_chat,
    encode_completion,
    request_class_of,
)
from lookahead.server.responses import Completion, sse
from lookahead.server.schemas import ChatCompletionRequest, CommonFields, CompletionRequest
from lookahead.server.startup import load_policy_drafts, public_policy
from lookahead.scheduler.scheduler import SchedulerConfig
from lookahead.server.batch_worker import BatchWorker
from lookahead.server.worker import Job, JobEnd, ModelWorker, StreamFn, timeout_error

RequestClassHeader = Annotated[
    str | None,
    Header(alias=CLASS_HEADER, description="Request class for the decoding policy (else metadata.request_class)"),
]


def ngram_caches_of(config: ServerConfig) -> NGramCaches | None:
    """The opted-in classes' caches: from --ngram-cache-file when it exists, plus empty ones for
    --ngram-cache classes it lacks. None when neither is given."""
    if not config.ngram_cache_classes and not config.ngram_cache_file:
        return None
    path = config.ngram_cache_file
    caches = NGramCaches.load(path) if path and os.path.exists(path) else NGramCaches(())
    if config.ngram_cache_classes:  # the flag decides which classes keep one; else the file's classes do
        caches.opt_in(config.ngram_cache_classes)
    return caches


def settle_tokenizer(loaded: Any) -> None:
    """Encode once, so the fast tokenizer's truncation/padding state is what every later call wants.

    No lock guards the tokenizer: request threads encode while the model worker decodes. A Rust
    tokenizer shared by threads fails ("Already borrowed") only when one call changes its state
    (truncation, padding) while another uses it; transformers changes that state only when a call asks
    for different settings than the current ones. After this call, encoding (plain text, token ids and
    chat templates, all without truncation or padding) and decoding never change it again
    (tests/server/test_operator_controls.py checks that)."""
    loaded.encode("settle", raw=True)


def create_app(
    loaded: Any, config: ServerConfig, *, stream_fn: StreamFn | None = None, drafts: dict[str, Any] | None = None,
    learned: dict[str, dict[str, Any]] | None = None,
) -> FastAPI:
    """The server for `loaded` (a lookahead LoadedModel), decoding up to `config.max_batch` requests per
    forward pass; with `stream_fn` (a stand-in for lookahead.stream_events) it runs one request at a time
    through that function instead.
    `drafts`: the policy's draft models by name, as load_policy_drafts() returns them (None: load them
    now; a ConfigError names the policy entry that cannot be served). `learned`: what each request class
    learned before, as lookahead.learned.read_learned returns it (None: read config.learned_file if it
    exists; it is written back at shutdown)."""
    worker: ModelWorker
    if drafts is None:
        drafts = load_policy_drafts(config.policy, loaded)
    settle_tokenizer(loaded)

    caches = ngram_caches_of(config)
    metrics = ServerMetrics(
        price_per_hour_usd=config.price_per_hour_usd,
        known_classes=[*config.policy.classes.keys(), *(caches.classes if caches else ())],
        max_class_labels=config.max_class_labels,
        queue_depth=lambda: worker.queue_depth,
        in_flight=lambda: worker.in_flight,
    )
    for cls in caches.classes if caches else ():
        metrics.ngram_cache(cls, caches.get(cls).memory())  # type: ignore[union-attr]
    if stream_fn is None:  # the engine: continuous batching (server/batch_worker.py)
        worker = BatchWorker(
            loaded,
            metrics,
            max_queue=config.max_queue,
            scheduler=SchedulerConfig(max_batch=config.max_batch, max_rows=config.max_rows),
            max_kv_tokens=config.max_kv_tokens or config.max_batch * loaded.context_length,
            ngram_caches=caches,
            adaptive=config.adaptive,
            prefix_cache=PrefixCache(config.prefix_cache_mb << 20),
        )
    else:  # a stream function given in code (tests): one request at a time through it
        worker = ModelWorker(
            loaded,
            metrics,
            max_queue=config.max_queue,
            stream_fn=stream_fn,
            ngram_caches=caches,
            adaptive=config.adaptive,
        )
    if learned is None and config.learned_file and os.path.exists(config.learned_file):
        learned = read_learned(loaded, config.learned_file)
    worker.restore_learned(learned or {})
    started = int(time.time())

    def startup() -> None:
        worker.start()

    def shutdown() -> None:
        """Let in-flight requests end (bounded by shutdown_timeout_s), then save the n-gram caches and what
        the classes learned."""
        worker.stop(config.shutdown_timeout_s)
        if caches is not None and config.ngram_cache_file:
            try:  # after the worker stopped: nothing writes them now
                caches.save(config.ngram_cache_file)
            except OSError as exc:
                logging.getLogger("lookahead.server").error("could not save the n-gram caches: %s", exc)
        if config.learned_file:
            try:
                write_learned(loaded, config.learned_file, worker.learned())
            except OSError as exc:
                logging.getLogger("lookahead.server").error("could not save what the classes learned: %s", exc)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        startup()
        yield
        await asyncio.to_thread(shutdown)

    app = FastAPI(
        title="lookahead",
        summary="OpenAI-compatible server for lossless lookahead decoding",
        version="1",
        lifespan=lifespan,
    )
    app.state.worker = worker
    app.state.metrics = metrics
    app.state.config = config
    # For hosts that run the app without an ASGI lifespan (a Ray Serve replica, lookahead/cluster).
    app.state.startup = startup
    app.state.shutdown = shutdown

    def label_of(scope: Any) -> str:
        """The class label of a refused request: from the parsed body when it got that far, else the header."""
        state = scope.get("state") or {}
        if "class_label" in state:
            return str(state["class_label"])
        header = dict(scope.get("headers") or {}).get(CLASS_HEADER.encode())
        try:
            cls = request_class_of(header.decode("latin-1") if header else None, None)
        except APIError:
            return UNLABELLED
        return metrics.class_label(cls, register=False)

    def on_error(request: Request, err: APIError) -> None:
        # Timeouts and cancellations are outcomes of admitted requests (lookahead_requests_total).
        if 400 <= err.status < 500 and err.code not in ("request_timeout", "cancelled"):
            metrics.reject(label_of(request.scope), err.code or str(err.status))

    install_error_handlers(app, on_error=on_error)
    app.add_middleware(
        BodyLimitMiddleware,
        limit=config.max_body_bytes,
        on_reject=lambda scope: metrics.reject(label_of(scope), "body_too_large"),
    )
    if config.auth_enabled:  # outermost: unauthenticated bodies are never read
        app.add_middleware(
            AuthMiddleware,
            keys=config.key_classes(),
            on_reject=lambda scope: metrics.reject(label_of(scope), "unauthorized"),
        )

    async def start(
        request: Request, body: CommonFields, header_class: str | None, encode: Callable[..., list[int]]
    ) -> Job:
        check_model(body.model, loaded)
        request_class = request_class_of(header_class, body.metadata)
        label = metrics.class_label(request_class)
        request.state.class_label = label

        ids = await run_in_threadpool(encode, loaded, body)
        # With auth on, the n-gram caches a request may use are those its API key is bound to.
        state = request.scope.get("state") or {}
        cache_classes = state.get("cache_classes", frozenset()) if config.auth_enabled else None
        spec = build_spec(
            body,
            ids,
            request_class,
            loaded=loaded,
            config=config,
            metrics=metrics,
            drafts=drafts,
            cache_classes=cache_classes,
        )
        job = Job(spec, asyncio.get_running_loop(), config.request_timeout_s)
        worker.submit(job)
        return job

    async def respond(request: Request, body: CommonFields, job: Job, chat: bool) -> Response:
        completion = Completion(chat=chat, model=loaded.name, price_per_hour_usd=config.price_per_hour_usd)
        if body.stream:
            return StreamingResponse(
                _stream(request, job, completion, body.include_usage),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        return JSONResponse(await _collect(request, job, completion))

    @app.get("/health", summary="Liveness (no auth)")
    async def health() -> JSONResponse:
        ok = worker.alive
        return JSONResponse({"status": "ok" if ok else "model worker stopped"}, status_code=200 if ok else 503)

    @app.get("/metrics", summary="Prometheus metrics")
    async def prometheus() -> Response:
        payload, content_type = metrics.render()
        return Response(payload, media_type=content_type)

    def model_card() -> dict[str, Any]:
        return {
            "id": loaded.name,
            "object": "model",
            "created": started,
            "owned_by": "lookahead",
            "context_length": loaded.context_length,
            "dtype": str(loaded.dtype).replace("torch.", ""),
            "width_floor": _width_floor(loaded.model),
        }

    @app.get("/v1/models", summary="The one loaded model")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}", summary="One model")
    async def model(model_id: str) -> dict[str, Any]:
        check_model(model_id, loaded)
        return model_card()

    @app.get("/v1/policy", summary="The decoding policy in force")
    async def policy() -> dict[str, Any]:
        return {"object": "policy", "source": config.policy_source, "policy": public_policy(config.policy),
                "calibration": worker.calibration()}

    @app.post("/v1/chat/completions", summary="Chat completion (OpenAI-compatible)")
    async def chat_completions(
        body: ChatCompletionRequest, request: Request, x_request_class: RequestClassHeader = None
    ) -> Response:
        job = await start(request, body, x_request_class, encode_chat)
        return await respond(request, body, job, chat=True)

    @app.post("/v1/completions", summary="Text completion (OpenAI-compatible)")
    async def completions(
        body: CompletionRequest, request: Request, x_request_class: RequestClassHeader = None
    ) -> Response:
        job = await start(request, body, x_request_class, encode_completion)
        return await respond(request, body, job, chat=False)

    return app


async def _watch_disconnect(request: Request, job: Job) -> None:
    """Cancel the job as soon as the client goes away (the body has been read by now)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel("disconnect")
            return


async def _collect(request: Request, job: Job, completion: Completion) -> dict[str, Any]:
    watcher = asyncio.create_task(_watch_disconnect(request, job))
    try:
        while True:
            try:
                item = await job.next()
            except TimeoutError:
                job.cancel("timeout")
                raise timeout_error(job.timeout_s) from None
            if isinstance(item, JobEnd):
                if item.error is not None:
                    raise item.error
                if item.result is None:  # cancelled: the client is gone, nobody reads this
                    raise APIError(400, "the request was cancelled", code="cancelled")
                return completion.body(item.result)
    finally:
        watcher.cancel()
        job.cancel("abandoned")  # no effect once the job has ended


async def _stream(request: Request, job: Job, completion: Completion, include_usage: bool) -> AsyncIterator[str]:
    watcher = asyncio.create_task(_watch_disconnect(request, job))
    try:
        first = completion.first_chunk(include_usage)
        if first is not None:
            yield first
        while True:
            try:
                item = await job.next()
            except TimeoutError:
                job.cancel("timeout")
                yield sse(timeout_error(job.timeout_s).body())
                return
            if isinstance(item, JobEnd):
                if item.error is not None:
                    yield sse(item.error.body())
                elif item.result is not None:
                    for chunk in completion.final_chunks(item.result, include_usage):
                        yield chunk
                return
            if item.text:  # one chunk per decoding step: a step that accepts several tokens sends them together
                yield completion.text_chunk(item.text, include_usage)
    finally:
        watcher.cancel()
        job.cancel("disconnect")  # no effect once the job has ended


def _width_floor(model: Any) -> int | None:
    """The floor every exact pass is padded to (engine/numerics.py), probed once per model."""
    from lookahead.engine.numerics import width_probe

    return width_probe(model).floor
