"""The measurement loop: every request under every strategy, interleaved, resumable, identity-checked.

Order: for each request, for each repeat, autoregressive first (it is the reference output), then
the other strategies, their order rotated from one request to the next. Consecutive measurements of
different strategies are therefore seconds apart, so slow machine drift affects all of them alike.
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from lookahead.bench.config import BASELINE, BenchConfig
from lookahead.bench.results import ResultsFile
from lookahead.bench.runners import REFERENCE_STRATEGIES, Measurement, RunSpec, get_runner, output_digest
from lookahead.config import SamplingConfig
from lookahead.errors import ConfigError, PromptError
from lookahead.workloads.format import Request

WARMUP_TOKENS = 8


@dataclass
class Outcome:
    rows: list[dict[str, Any]]
    measured: int = 0
    mismatches: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    interrupted: bool = False
    resumed_rows: int = 0


def select_requests(requests: Sequence[Request], *, limit_per_class: int | None,
                    classes: Sequence[str] | None) -> list[Request]:
    """At most `limit_per_class` per class (the first ones in file order); only `classes` when given.

    The result is interleaved across classes (each class's 1st request, then each one's 2nd, ...) so
    that an interrupted run has measured every class, not just the first ones in the file.
    """
    present = {r.cls for r in requests}
    if classes:
        missing = [c for c in classes if c not in present]
        if missing:
            raise ConfigError(f"--classes names {', '.join(missing)}, not in the workload "
                              f"(it has {', '.join(sorted(present))})")
    taken: dict[str, int] = defaultdict(int)
    out = []
    for r in requests:
        if classes and r.cls not in classes:
            continue
        if limit_per_class is not None and taken[r.cls] >= limit_per_class:
            continue
        out.append((taken[r.cls], r))
        taken[r.cls] += 1
    class_order = list(dict.fromkeys(r.cls for _, r in out))
    out.sort(key=lambda pair: (pair[0], class_order.index(pair[1].cls)))
    return [r for _, r in out]


def spec_for(req: Request, cfg: BenchConfig, repeat: int = 0) -> RunSpec:
    sampling = SamplingConfig(temperature=req.temperature, top_k=req.top_k, top_p=req.top_p,
                              seed=req.effective_seed % (2**63))
    return RunSpec(max_new_tokens=req.max_tokens or cfg.max_new_tokens, sampling=sampling, lookahead=cfg.lookahead,
                   request_class=req.cls, repeat=repeat)


def encode(loaded: Any, req: Request) -> list[int]:
    ids = loaded.encode(req.chat()) if req.messages is not None else loaded.encode(req.prompt or "", raw=True)
    return list(ids)


def make_row(req: Request, strategy: str, repeat: int, spec: RunSpec, m: Measurement, digest: str,
             reference: str | None) -> dict[str, Any]:
    held = strategy not in REFERENCE_STRATEGIES or req.greedy
    identical = None if (reference is None or not held) else digest == reference
    return {
        "request_id": req.id, "class": req.cls, "strategy": strategy, "repeat": repeat, "greedy": req.greedy,
        "max_new_tokens": spec.max_new_tokens, "prompt_tokens": m.prompt_tokens, "new_tokens": m.new_tokens,
        "steps": m.steps, "tokens_per_step": m.new_tokens / m.steps if m.steps else None,
        "guesses_verified": m.guesses_verified, "guesses_accepted": m.guesses_accepted,
        "acceptance_rate": m.guesses_accepted / m.guesses_verified if m.guesses_verified else None,
        "prefill_s": m.prefill_s, "decode_s": m.decode_s, "total_s": m.total_s, "ttft_s": m.ttft_s,
        "device_s": m.device_s, "cpu_s": m.cpu_s, "processed_tokens": m.processed_tokens,
        "wasted_fraction": max(0.0, 1.0 - m.new_tokens / m.processed_tokens) if m.processed_tokens else 0.0,
        "draft_steps": m.draft_steps, "draft_s": m.draft_s, "ngram_cache_bytes": m.ngram_cache_bytes,
        "cached_tokens": m.cached_tokens,
        "finish_reason": m.finish_reason, "output_sha256": digest, "dtype": m.dtype, "width_floor": m.width_floor,
        "identical": identical, "reference": BASELINE if identical is not None else None,
        "accepted_by_source": dict(m.accepted_by_source),
    }


class RunningSpeedup:
    """Per-class median of paired autoregressive/strategy latency ratios, for the progress bar."""

    def __init__(self, strategy: str | None) -> None:
        self.strategy = strategy
        self.times: dict[str, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))

    def add(self, row: dict[str, Any]) -> None:
        if row["repeat"] == 0 and row["strategy"] in (BASELINE, self.strategy):
            self.times[row["class"]][row["request_id"]][row["strategy"]] = float(row["total_s"])

    def text(self) -> str:
        parts = []
        for cls in sorted(self.times):
            r = [t[BASELINE] / t[self.strategy] for t in self.times[cls].values()
                 if BASELINE in t and self.strategy in t and t[self.strategy] > 0]
            if r:
                parts.append(f"{cls} {statistics.median(r):.2f}x")
        return " ".join(parts)


def _progress(total: int, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, disable=not enabled, unit="run", dynamic_ncols=True, file=sys.stderr,
                smoothing=0.1, desc="bench")


def plan(requests: Sequence[Request], cfg: BenchConfig, done: set[tuple[str, str, int]]) -> list[tuple[int, Request, str, int]]:
    others = [s for s in cfg.strategies if s != BASELINE]
    work = []
    for i, req in enumerate(requests):
        k = i % len(others)
        order = [BASELINE] + others[k:] + others[:k]
        for rep in range(cfg.repeats):
            for s in order:
                if (req.id, s, rep) not in done:
                    work.append((i, req, s, rep))
    return work


def run_bench(cfg: BenchConfig, loaded: Any, requests: Sequence[Request], *, err: TextIO | None = None) -> Outcome:
    """Measure every pending (request, strategy, repeat), appending rows to cfg.out/results.jsonl."""
    err = err or sys.stderr
    store = ResultsFile(cfg.out)
    store.check_run(cfg.fingerprint())
    store.load()
    if store.dropped_partial:
        print(f"note: removed an incomplete last row from {store.path} (an interrupted write); it is measured again",
              file=err)
    outcome = Outcome(rows=store.rows, resumed_rows=len(store.rows))
    wanted = {r.id for r in requests}
    refs: dict[str, str] = {}
    for row in store.rows:
        if row["strategy"] == BASELINE and row["request_id"] not in refs:
            refs[row["request_id"]] = row["output_sha256"]
        if row.get("identical") is False and row["request_id"] in wanted:
            outcome.mismatches.append({k: row[k] for k in ("request_id", "class", "strategy", "repeat")})
    work = plan(requests, cfg, store.keys)
    runners = {s: get_runner(s) for s in cfg.strategies}
    eos = tuple(loaded.eos_token_ids)
    running = RunningSpeedup(next((s for s in cfg.strategies if s != BASELINE and s not in REFERENCE_STRATEGIES),
                                  next(s for s in cfg.strategies if s != BASELINE)))
    for row in store.rows:
        running.add(row)
    prompts: dict[str, list[int] | None] = {}
    ref_tokens: dict[str, tuple[int, ...]] = {}

    def prompt_ids(req: Request, spec: RunSpec) -> list[int] | None:
        if req.id not in prompts:
            try:
                ids = encode(loaded, req)
                if len(ids) + spec.max_new_tokens > loaded.context_length:
                    raise PromptError(f"{len(ids)} prompt tokens + {spec.max_new_tokens} new tokens exceed the "
                                      f"model's context of {loaded.context_length}")
                prompts[req.id] = ids
            except PromptError as exc:
                prompts[req.id] = None
                outcome.skipped.append({"request_id": req.id, "class": req.cls, "reason": str(exc)})
                print(f"skipping {req.id}: {exc}", file=err)
        return prompts[req.id]

    if work and cfg.warmup:  # first calls pay one-off costs (allocations, thread pools): keep them out
        for _, req, _s, _ in work:
            ids = prompt_ids(req, spec_for(req, cfg))
            if ids is not None:
                base = spec_for(req, cfg)
                warm = RunSpec(min(WARMUP_TOKENS, base.max_new_tokens), base.sampling, base.lookahead)
                for s in cfg.strategies:
                    runners[s](loaded, ids, warm)
                break
    bar = _progress(len(work), cfg.progress)

    def measure(req: Request, s: str, rep: int) -> None:
        spec = spec_for(req, cfg, rep)
        ids = prompt_ids(req, spec)
        if ids is None:
            return
        try:
            m = runners[s](loaded, ids, spec)
        except PromptError as exc:  # the engine's own limits: skip the request, keep going
            prompts[req.id] = None
            outcome.skipped.append({"request_id": req.id, "class": req.cls, "reason": str(exc)})
            bar.write(f"skipping {req.id}: {exc}", file=err)
            return
        digest = output_digest(m.token_ids, eos)
        reference = refs.get(req.id)
        if s == BASELINE and reference is None:
            refs[req.id] = digest
            ref_tokens[req.id] = m.token_ids
        row = make_row(req, s, rep, spec, m, digest, reference)
        store.append(row)
        outcome.measured += 1
        running.add(row)
        if row["identical"] is False:
            outcome.mismatches.append({k: row[k] for k in ("request_id", "class", "strategy", "repeat")})
            where = _first_difference(ref_tokens.get(req.id), m.token_ids)
            bar.write(f"!!! MISMATCH: {req.id} ({req.cls}) under {s}, repeat {rep}: output differs from "
                      f"autoregressive{where}. Lookahead decoding must be lossless; this run will exit non-zero.",
                      file=err)
        bar.set_postfix_str(running.text(), refresh=False)

    with store:
        try:
            for _, req, s, rep in work:
                measure(req, s, rep)
                bar.update(1)
        except KeyboardInterrupt:
            outcome.interrupted = True
        finally:
            bar.close()
    outcome.rows = store.rows
    return outcome


def _first_difference(ref: tuple[int, ...] | None, got: tuple[int, ...]) -> str:
    if ref is None:
        return ""
    for i, (a, b) in enumerate(zip(ref, got)):
        if a != b:
            return f" at new token {i} ({a} expected, {b} produced)"
    return f" in length ({len(ref)} tokens expected, {len(got)} produced)"
