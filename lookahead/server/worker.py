"""The model worker: one thread owns the model; requests wait in a bounded queue.

The event loop never touches the model. A request becomes a Job; the worker runs the engine's
`stream_events` for it and hands each step's event back to the loop thread-safely. Between two
decoding steps the worker checks the job's cancel flag (set when the client disconnects, the request
times out or the server shuts down) and its deadline, and closes the engine generator, which stops
generation at once: a dropped client costs at most one more decoding step.
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any

from lookahead.candidates.ngram_cache import NGramCaches
from lookahead.candidates.recycling import SuccessorTable
from lookahead.engine.calibration import Calibrator
from lookahead.config import SamplingConfig
from lookahead.errors import LookaheadError
from lookahead.policy import Decision
from lookahead.server.errors import APIError
from lookahead.server.metrics import ServerMetrics

log = logging.getLogger("lookahead.server")

StreamFn = Callable[..., Iterator[Any]]  # lookahead.stream_events: a generator of StepEvents


@dataclass(frozen=True)
class JobSpec:
    """Everything the worker needs to run one request."""

    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    decision: Decision  # the strategy and its parameters
    sampling: SamplingConfig
    stop: tuple[str, ...]
    label: str  # the request class as a metrics label
    draft: Any = None  # the policy's preloaded draft model (LoadedModel) for a speculative decision
    ngram_cache: bool = True  # may use its class's n-gram cache and recycled successors (False: its API key
    #                           is not bound to the class)

    @property
    def strategy(self) -> str:
        return self.decision.strategy


@dataclass(frozen=True)
class JobEnd:
    """The last item a job delivers: the engine's GenerationResult, or the error to report."""

    result: Any = None  # lookahead GenerationResult
    error: APIError | None = None


def timeout_error(seconds: float) -> APIError:
    return APIError(
        408,
        f"the request did not finish within the server's request timeout of {seconds:g} s "
        "(queue wait + generation); ask for fewer max_tokens, retry later, or raise --request-timeout",
        type="timeout_error",
        code="request_timeout",
        # The openai client retries 408 by default, which would resend work that already ran past the
        # operator's limit; it honours this header and gives the error to the caller instead.
        headers={"x-should-retry": "false"},
    )


def shutdown_error() -> APIError:
    return APIError(
        503,
        "the server is shutting down and did not run this request; retry on another instance",
        type="server_error",
        code="shutting_down",
    )


def _engine_stream() -> StreamFn:
    from lookahead import stream_events

    return stream_events


class Job:
    """One request in flight: its spec, its deadline, its cancel flag and its event channel."""

    def __init__(self, spec: JobSpec, loop: asyncio.AbstractEventLoop, timeout_s: float) -> None:
        self.spec = spec
        self.loop = loop
        self.events: asyncio.Queue[Any] = asyncio.Queue()
        self.arrived = time.monotonic()
        self.timeout_s = timeout_s
        self.deadline = self.arrived + timeout_s
        self._cancel = threading.Event()
        self._cancel_lock = threading.Lock()
        self.cancel_reason = "cancelled"

    def cancel(self, reason: str) -> None:
        """Ask the worker to stop this job (thread-safe; the first reason given is kept)."""
        with self._cancel_lock:
            if not self._cancel.is_set():
                self.cancel_reason = reason
                self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def push(self, item: Any) -> None:
        """From the worker thread: hand an event to the request's coroutine."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:  # the loop is closed: the server is gone, nobody is listening
            pass

    async def next(self) -> Any:
        """The next StepEvent or JobEnd; raises TimeoutError at the deadline."""
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        try:
            return await asyncio.wait_for(self.events.get(), remaining)
        except asyncio.TimeoutError:  # a distinct class before Python 3.11
            raise TimeoutError from None


class ModelWorker:
    """Runs jobs one at a time on a dedicated thread.

    Shutdown is race-free: `_admit` guards both "check _stopping, then queue" (submit) and "dequeue,
    then mark current" (the worker), and cancel_all() sets _stopping and drains under the same lock,
    so every job is either refused, drained, found as the current one, or seen as cancelled by the
    worker before its first step."""

    def __init__(
        self,
        loaded: Any,
        metrics: ServerMetrics,
        *,
        max_queue: int,
        stream_fn: StreamFn | None = None,
        ngram_caches: NGramCaches | None = None,
        adaptive: bool = True,
    ) -> None:
        self._loaded = loaded
        self._adaptive = adaptive
        self._admit = threading.Lock()
        self._metrics = metrics
        self._caches = ngram_caches  # per class label; only this thread writes them
        self._calibrators: dict[str, Calibrator] = {}  # per class label: what its guesses' acceptance has been
        self._successors: dict[str, SuccessorTable] = {}  # per class label: the model's recycled successors
        self._stream: StreamFn = stream_fn if stream_fn is not None else _engine_stream()
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self._thread: threading.Thread | None = None
        self._current: Job | None = None
        self._stopping = threading.Event()
        self._service_s = 1.0  # moving average of one job's run time, for Retry-After

    # -- state, read from the event loop -------------------------------------------------------
    def learned(self) -> dict[str, dict[str, Any]]:
        """Per class label: {"calibrator": ..., "successors": ...}, what its requests learned (lookahead/learned.py)."""
        out: dict[str, dict[str, Any]] = {label: {"calibrator": cal} for label, cal in list(self._calibrators.items())}
        for label, table in list(self._successors.items()):
            out.setdefault(label, {})["successors"] = table
        return out

    def restore_learned(self, learned: dict[str, dict[str, Any]]) -> None:
        """Start from what an earlier server learned (before the first request)."""
        for label, kinds in learned.items():
            if "calibrator" in kinds:
                self._calibrators[label] = kinds["calibrator"]
            if "successors" in kinds:
                self._successors[label] = kinds["successors"]

    def calibration(self) -> dict[str, dict[str, dict[str, float]]]:
        """Per class: the calibrated acceptance of its guesses, per source/feature/depth."""
        return {label: cal.report() for label, cal in list(self._calibrators.items())}

    @property
    def queue_depth(self) -> int:
        return self._queue.qsize()

    @property
    def in_flight(self) -> int:
        return 0 if self._current is None else 1

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def retry_after_s(self) -> int:
        """Seconds until a queue slot is likely free: the queue ahead times the average job."""
        return max(1, min(600, math.ceil(self._service_s * (self._queue.qsize() + 1))))

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="lookahead-model-worker", daemon=True)
            self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue a job, or raise a 429 APIError with Retry-After at once when the queue is full
        (a 503 once shutdown has begun)."""
        try:
            with self._admit:
                if self._stopping.is_set():
                    raise shutdown_error()
                self._queue.put_nowait(job)
        except queue.Full:
            wait = self.retry_after_s()
            raise APIError(
                429,
                f"the server is busy: {self._queue.maxsize} requests are already waiting for the model; "
                f"retry after {wait} s",
                type="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": str(wait)},
            ) from None

    def cancel_all(self) -> None:
        """Refuse new jobs; end queued ones and the running one with a 503 'shutting down' error."""
        self._stopping.set()  # before the lock: a submit that has not checked yet refuses at once
        with self._admit:
            self._drain()

    def _drain(self) -> None:
        sentinel = False
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is None:
                sentinel = True  # stop() already asked the thread to end: keep that request
            else:
                job.cancel("shutdown")
                self._metrics.requests.labels(job.spec.label, job.spec.strategy, "shutdown").inc()
                job.push(JobEnd(error=shutdown_error()))
        if sentinel:
            self._queue.put_nowait(None)
        for job in self._running_jobs():
            job.cancel("shutdown")

    def _running_jobs(self) -> list[Job]:
        """The jobs being generated now (read under `_admit`)."""
        current = self._current
        return [] if current is None else [current]

    def stop(self, timeout_s: float) -> None:
        """cancel_all(), then end the thread, waiting up to timeout_s for it."""
        self.cancel_all()
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            pass
        if self._thread is not None:
            self._thread.join(timeout_s)

    # -- the worker thread --------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            with self._admit:
                if self._stopping.is_set():  # shutdown began after the dequeue: never run it
                    job.cancel("shutdown")
                self._current = job
            try:
                self._run(job)
            except Exception:  # never let one request kill the worker
                log.exception("model worker: unexpected error outside a job")
                job.push(JobEnd(error=APIError(500, "internal error in the model worker", type="server_error")))
            finally:
                self._current = None

    def _run(self, job: Job) -> None:
        spec = job.spec
        m = self._metrics
        labels = (spec.label, spec.strategy)
        if job.cancelled or time.monotonic() >= job.deadline:
            status = job.cancel_reason if job.cancelled else "timeout"
            m.requests.labels(*labels, status).inc()
            job.push(JobEnd(error=self._cancel_error(job, status)))
            return
        started = time.monotonic()
        tokens, result, error, status = 0, None, None, "ok"
        events = None
        cache = self._caches.get(spec.label) if self._caches is not None and spec.ngram_cache else None
        extra: dict[str, Any] = {} if cache is None else {"ngram_cache": cache}
        extra["calibrator"] = self._calibrators.setdefault(spec.label, Calibrator())
        if spec.ngram_cache:  # the class's recycled successors hold its text: shared like its n-gram cache
            extra["successors"] = self._successors.setdefault(spec.label, SuccessorTable())
        if spec.draft is not None:
            extra["draft"] = spec.draft
        try:
            events = self._stream(
                self._loaded,
                list(spec.prompt_ids),
                max_new_tokens=spec.max_new_tokens,
                strategy=spec.strategy,
                sampling=spec.sampling,
                stop=list(spec.stop),
                adaptive=self._adaptive,
                **spec.decision.engine_kwargs(),
                **extra,
            )
            for event in events:
                if event.token_ids:
                    if tokens == 0:
                        m.ttft.labels(*labels).observe(time.monotonic() - job.arrived)
                    tokens += len(event.token_ids)
                job.push(event)
                if event.result is not None:
                    result = event.result
                    break
                if job.cancelled:
                    status = job.cancel_reason
                    error = self._cancel_error(job, status)
                    break
                if time.monotonic() >= job.deadline:
                    status, error = "timeout", timeout_error(job.timeout_s)
                    break
        except LookaheadError as exc:
            status, error = "error", APIError(400, str(exc), code="invalid_value")
        except Exception as exc:
            log.exception("model worker: generation failed")
            status = "error"
            error = APIError(
                500, f"generation failed ({type(exc).__name__}); the server is still running", type="server_error"
            )
        finally:
            if isinstance(events, Generator):
                events.close()  # stops the engine within the current step
        if result is None and status == "ok":
            status = "error"
            error = APIError(500, "the engine ended without a final result", type="server_error")
        elapsed = time.monotonic() - started
        if cache is not None:
            m.ngram_cache(spec.label, cache.memory())
        self._service_s = 0.8 * self._service_s + 0.2 * elapsed
        self._record(job, status, result, tokens, elapsed)
        job.push(JobEnd(result=result, error=error))

    def _record(self, job: Job, status: str, result: Any, tokens: int, elapsed_s: float) -> None:
        """Metrics of one job. Steps and guesses need the final stats; a cancelled job still counts
        the tokens it produced and its wall time as device time."""
        m = self._metrics
        labels = (job.spec.label, job.spec.strategy)
        device_s = elapsed_s
        if result is not None:
            stats = result.stats
            tokens, device_s = stats.new_tokens, stats.device_s
            m.decode_steps.labels(*labels).inc(stats.steps)
            m.accepted_guesses.labels(*labels).inc(stats.guesses_accepted)
            m.latency.labels(*labels).observe(time.monotonic() - job.arrived)
        m.requests.labels(*labels, status).inc()
        m.generated_tokens.labels(*labels).inc(tokens)
        m.device_seconds.labels(*labels).inc(device_s)
        m.cost_usd.labels(*labels).inc(m.cost(device_s))

    @staticmethod
    def _cancel_error(job: Job, status: str) -> APIError | None:
        """What a cancelled job tells its request (nobody listens after a disconnect)."""
        if status == "timeout":
            return timeout_error(job.timeout_s)
        if status == "shutdown":
            return shutdown_error()
        return None
