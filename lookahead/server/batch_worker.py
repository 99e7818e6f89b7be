"""The batched model worker: one thread runs the continuous-batching scheduler (lookahead/scheduler).

Between two decoding passes the worker (1) admits queued jobs while the batch has a free slot and the
KV budget allows (each is prefilled into its own slot), (2) runs one pass for every request in the
batch, (3) hands each request's events to its coroutine, and (4) retires requests that finished, were
cancelled (client disconnect, shutdown) or ran past their deadline: a retired request's rows and KV
slot are free for the next pass. Queueing, 429s, timeouts, shutdown and metrics are those of the
one-at-a-time worker (server/worker.py), which this extends.
"""

from __future__ import annotations

import logging
import queue
import time
from dataclasses import dataclass
from typing import Any

from lookahead.candidates.ngram_cache import NGramCaches
from lookahead.candidates.recycling import SuccessorTable
from lookahead.config import GenerationConfig
from lookahead.engine.calibration import Calibrator
from lookahead.engine.prefix_cache import PrefixCache
from lookahead.errors import LookaheadError
from lookahead.scheduler.request import Request
from lookahead.scheduler.scheduler import Scheduler, SchedulerConfig
from lookahead.server.errors import APIError
from lookahead.server.metrics import ServerMetrics
from lookahead.server.worker import Job, JobEnd, ModelWorker, timeout_error

log = logging.getLogger("lookahead.server")


@dataclass
class _Running:
    job: Job
    request: Request
    started: float
    tokens: int = 0


class BatchWorker(ModelWorker):
    """Runs up to `scheduler.max_batch` jobs together. `max_kv_tokens`: most tokens (prompt + completion
    budget) the requests in flight and in the queue may reserve; a request beyond it gets 429."""

    def __init__(self, loaded: Any, metrics: ServerMetrics, *, max_queue: int, scheduler: SchedulerConfig,
                 max_kv_tokens: int, ngram_caches: NGramCaches | None = None, adaptive: bool = True,
                 prefix_cache: PrefixCache | None = None) -> None:
        super().__init__(loaded, metrics, max_queue=max_queue, stream_fn=_no_stream, ngram_caches=ngram_caches,
                         adaptive=adaptive)
        self._config = scheduler
        self._prefix = prefix_cache  # prompt prefixes reused across requests (engine/prefix_cache.py)
        self._max_kv = max_kv_tokens
        self._reserved = 0  # tokens reserved by queued and running jobs (guarded by _admit)
        self._running: list[_Running] = []
        self._stop_seen = False

    @property
    def in_flight(self) -> int:
        return len(self._running)

    def _running_jobs(self) -> list[Job]:
        return [r.job for r in self._running]

    @staticmethod
    def _need(job: Job) -> int:
        return len(job.spec.prompt_ids) + job.spec.max_new_tokens

    def submit(self, job: Job) -> None:
        """Queue a job, or 429 at once when the queue is full or the KV budget is spoken for."""
        need = self._need(job)
        with self._admit:
            busy = self._reserved + need > self._max_kv and self._reserved > 0
            if not busy:
                self._reserved += need
        if busy:
            wait = self.retry_after_s()
            raise APIError(
                429,
                f"the server is busy: requests in flight hold {self._reserved} of its {self._max_kv} KV-cache tokens "
                f"and this one needs {need}; retry after {wait} s",
                type="rate_limit_error", code="kv_budget_full", headers={"Retry-After": str(wait)},
            )
        try:
            super().submit(job)
        except APIError:
            self._release(job)
            raise

    def _release(self, job: Job) -> None:
        with self._admit:
            self._reserved -= self._need(job)

    def _drain(self) -> None:
        """(Under `_admit`.) Queued jobs give back their KV reservations; super() ends them with a 503."""
        items: list[Job | None] = []
        while True:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                break
        for job in items:
            if job is not None:
                self._reserved -= self._need(job)
            self._queue.put_nowait(job)
        super()._drain()

    # -- the worker thread --------------------------------------------------------------------
    def _loop(self) -> None:
        # probes the width floor (and whether prompts split exactly) and reads the cost curve here
        scheduler = Scheduler(self._loaded, self._config, self._prefix)
        while True:
            self._admit_jobs(scheduler, block=not self._running)
            if not self._running:
                if self._stop_seen:
                    return
                continue
            try:
                events = scheduler.step()
            except Exception:
                log.exception("model worker: a batched step failed")
                for run in list(self._running):
                    self._end(scheduler, run, "error", APIError(
                        500, "generation failed in a batched step; the server is still running", type="server_error"))
                continue
            self._deliver(scheduler, events)
            now = time.monotonic()
            for run in list(self._running):  # cancelled or late: out of the batch before the next pass
                if run.job.cancelled:
                    status = run.job.cancel_reason
                    self._end(scheduler, run, status, self._cancel_error(run.job, status))
                elif now >= run.job.deadline:
                    self._end(scheduler, run, "timeout", timeout_error(run.job.timeout_s))
            m = self._metrics
            if scheduler.last is not None:
                m.batch_size.set(scheduler.last.batch)
                m.batch_steps.inc()
                m.step_rows.inc(scheduler.last.rows)
                m.speculative_rows.inc(scheduler.last.speculative_rows)
            m.kv_tokens.set(scheduler.kv_tokens)

    def _admit_jobs(self, scheduler: Scheduler, block: bool) -> None:
        """Move queued jobs into the batch while it has room (waiting for one when `block`)."""
        while scheduler.free_slots and not self._stop_seen:
            try:
                job = self._queue.get(timeout=0.5) if block else self._queue.get_nowait()
            except queue.Empty:
                return
            if job is None:
                self._stop_seen = True
                return
            block = False
            with self._admit:
                if self._stopping.is_set():  # shutdown began after the dequeue: never run it
                    job.cancel("shutdown")
            self._start(scheduler, job)

    def _start(self, scheduler: Scheduler, job: Job) -> None:
        spec = job.spec
        labels = (spec.label, spec.strategy)
        if job.cancelled or time.monotonic() >= job.deadline:
            status = job.cancel_reason if job.cancelled else "timeout"
            self._metrics.requests.labels(*labels, status).inc()
            self._release(job)
            job.push(JobEnd(error=self._cancel_error(job, status)))
            return
        cache = self._caches.get(spec.label) if self._caches is not None and spec.ngram_cache else None
        try:
            cfg = GenerationConfig(max_new_tokens=spec.max_new_tokens, strategy=spec.strategy, sampling=spec.sampling,
                                   stop=spec.stop, adaptive=self._adaptive, exact=self._config.exact,
                                   **spec.decision.engine_kwargs())
            request = Request(self._loaded, list(spec.prompt_ids), cfg, draft=spec.draft, ngram_cache=cache,
                              calibrator=self._calibrators.setdefault(spec.label, Calibrator()),
                              successors=self._successors.setdefault(spec.label, SuccessorTable())
                              if spec.ngram_cache else SuccessorTable())
            run = _Running(job, request, time.monotonic())
            scheduler.add(request)
        except LookaheadError as exc:
            self._finish(job, "error", None, 0, 0.0, APIError(400, str(exc), code="invalid_value"))
            return
        except Exception as exc:
            log.exception("model worker: could not start a request")
            self._finish(job, "error", None, 0, 0.0, APIError(
                500, f"generation failed ({type(exc).__name__}); the server is still running", type="server_error"))
            return
        with self._admit:
            self._running.append(run)

    def _deliver(self, scheduler: Scheduler, events: list[Any]) -> None:
        by_request = {id(r.request): r for r in self._running}
        for request, event in events:
            run = by_request[id(request)]
            if event.token_ids:
                if run.tokens == 0:
                    self._metrics.ttft.labels(run.job.spec.label, run.job.spec.strategy).observe(
                        time.monotonic() - run.job.arrived)
                run.tokens += len(event.token_ids)
            run.job.push(event)
            if event.result is not None:
                self._end(scheduler, run, "ok", None, event.result)

    def _end(self, scheduler: Scheduler, run: _Running, status: str, error: APIError | None,
             result: Any = None) -> None:
        if run.request in scheduler.active:
            scheduler.remove(run.request)
        with self._admit:
            self._running.remove(run)
        self._finish(run.job, status, result, run.tokens, time.monotonic() - run.started, error)

    def _finish(self, job: Job, status: str, result: Any, tokens: int, elapsed: float,
                error: APIError | None) -> None:
        self._release(job)
        if self._caches is not None and job.spec.ngram_cache and job.spec.label in self._caches.classes:
            self._metrics.ngram_cache(job.spec.label, self._caches.get(job.spec.label).memory())  # type: ignore[union-attr]
        if self._prefix is not None:
            self._metrics.prefix_cache(self._prefix.stats())
        self._service_s = 0.8 * self._service_s + 0.2 * elapsed
        self._record(job, status, result, tokens, elapsed)
        job.push(JobEnd(result=result, error=error))


def _no_stream(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the batched worker runs the scheduler, not a stream function")
