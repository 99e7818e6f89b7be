"""Helpers shared by stage_times.py and source_times.py: perf_counter wrappers that add each call's wall
time to a counter, and the loop over prompts a-f (192 new tokens, each prompt repeated with its learned
state carried over) or over the first requests of a workload file (128 new tokens, each request with its
own temperature and seed, one calibrator and successor table across them as a class shares them)."""
from __future__ import annotations

import collections
import functools
import json
import time
from typing import Any, Callable

import torch

import lookahead
from lookahead.bench.prompts import PROMPTS
from lookahead.config import SamplingConfig
from lookahead.candidates.recycling import SuccessorTable
from lookahead.engine.calibration import Calibrator

acc: collections.Counter[str] = collections.Counter()  # label -> seconds


def timed(label: str, f: Callable[..., Any]) -> Callable[..., Any]:
    """f, adding its wall time to acc[label]."""
    @functools.wraps(f)
    def g(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        out = f(*a, **k)
        acc[label] += time.perf_counter() - t
        return out
    return g


def wrap(obj: Any, name: str, label: str) -> None:
    """Replace obj.name with its timed version."""
    setattr(obj, name, timed(label, getattr(obj, name)))


def load() -> lookahead.LoadedModel:
    torch.set_num_threads(2)
    return lookahead.load("smollm2-135m-instruct", dtype="bfloat16")


def run(lm: lookahead.LoadedModel, strategy: str, repeats: int, prompts: str = "abcdef") -> int:
    """Decode the prompts with `strategy` (acc cleared first); returns the steps taken. `prompts` ending in
    .jsonl: the first `repeats` requests of that workload file instead (see `run_file`)."""
    if prompts.endswith(".jsonl"):
        return run_file(lm, strategy, repeats, prompts)
    acc.clear()
    steps = 0
    for p in prompts:
        ids = lm.encode(PROMPTS[p])
        calibrator, successors = Calibrator(), SuccessorTable()
        for _ in range(repeats):
            r = lookahead.generate(lm, ids, max_new_tokens=192, strategy=strategy, calibrator=calibrator,
                                   successors=successors, prefix_cache=False)
            steps += r.stats.steps
    return steps


def run_file(lm: lookahead.LoadedModel, strategy: str, count: int, path: str) -> int:
    """Decode the first `count` requests of a workload file (greedy or sampled as each says; 128 new tokens)
    with `strategy`, one calibrator and successor table across them (acc cleared first); returns the steps."""
    acc.clear()
    steps = 0
    calibrator, successors = Calibrator(), SuccessorTable()
    for line in open(path).readlines()[:count]:
        r = json.loads(line)
        sampling = SamplingConfig(temperature=r.get("temperature", 0.0), top_p=r.get("top_p", 1.0), seed=r.get("seed", 0))
        prompt = r["messages"] if "messages" in r else r["prompt"]
        g = lookahead.generate(lm, prompt, raw="messages" not in r, max_new_tokens=128, strategy=strategy,
                               calibrator=calibrator, successors=successors, prefix_cache=False, sampling=sampling)
        steps += g.stats.steps
    return steps
