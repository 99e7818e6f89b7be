"""Driving a Scheduler in tests: requests arriving at random steps, and draining a batch."""

from __future__ import annotations

import random

import lookahead
from lookahead.config import GenerationConfig
from lookahead.scheduler.request import Request
from lookahead.scheduler.scheduler import Scheduler, SchedulerConfig


def drain(scheduler: Scheduler) -> dict[int, list[int]]:
    """Step until the batch is empty; the tokens of every request that finished, by id(request)."""
    done: dict[int, list[int]] = {}
    while scheduler.active:
        for request, event in scheduler.step():
            if event.result is not None:
                done[id(request)] = event.result.token_ids
    return done


def run_batched(lm: lookahead.LoadedModel, requests: list[tuple[list[int], GenerationConfig]], max_batch: int,
                seed: int) -> tuple[dict[int, list[int]], int]:
    """Decode `requests` (prompt ids, config) through one scheduler; each waits a random number of steps
    before it may join. Returns tokens per request index and the widest batch seen."""
    rng = random.Random(seed)
    scheduler = Scheduler(lm, SchedulerConfig(max_batch=max_batch))
    waiting = sorted((rng.randint(0, 6), i) for i in range(len(requests)))
    tokens: dict[int, list[int]] = {}
    index: dict[int, int] = {}
    widest, step = 0, 0
    while waiting or scheduler.active:
        while waiting and waiting[0][0] <= step and scheduler.free_slots:
            _, i = waiting.pop(0)
            request = Request(lm, requests[i][0], requests[i][1])
            index[id(request)] = i
            scheduler.add(request)
        for request, event in scheduler.step():
            if event.result is not None:
                tokens[index[id(request)]] = event.result.token_ids
        widest = max(widest, scheduler.last.batch if scheduler.last else 0)
        step += 1
    return tokens, widest
