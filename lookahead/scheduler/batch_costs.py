"""How a pass's time grows with the requests in it, and the largest batch worth running.

The engine's cost curve (engine/costs.py) times k query rows of ONE sequence; a batch of B requests
also reads B caches, so it costs more than the curve's c(B) (measured here: 16 one-row sequences
over 256 cached tokens cost 1.8x one, where the curve says 1.28). This module times the batched
pass itself: B sequences, one row each, over `context` cached tokens, for B in BATCHES.

The default maximum batch is where batching stops paying: throughput at batch B is B / t(B); going
from B to the next measured size must raise it by at least GAIN (10%), else the extra requests only
make every request's steps slower. `lookahead profile` re-times it; the server reads it when
--max-batch is not given.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence

import torch

from lookahead.cachefile import read_json, update_json
from lookahead.engine.costs import MEASURE_CONTEXT
from lookahead.engine.model_runner import Rows
from lookahead.engine.numerics import width_probe
from lookahead.engine.step import StepRunner
from lookahead.models.loader import LoadedModel
from lookahead.models.registry import cache_root

BATCHES = (1, 2, 4, 8, 16, 32)
GAIN = 1.10
FALLBACK = 8  # models whose timings mean nothing (the random-weight test models)
VERSION = 1


def measure_batches(runner: StepRunner, vocab: int, batches: Sequence[int] = BATCHES, repeats: int = 3,
                    context: int = MEASURE_CONTEXT) -> dict[int, float]:
    """Median seconds of one pass over B sequences (one row each, `context` cached tokens each); batches
    whose pass would be wider than the runner's ceiling (engine/numerics.py) are not timed."""
    model = runner.model
    batches = [b for b in batches if model.fits(b)] or [1]
    gen = torch.Generator().manual_seed(0)
    cache = runner.new_cache(max(batches))
    for slot in range(max(batches)):
        cache.select(slot, slot + 1)
        runner.model.prefill(cache, torch.randint(0, vocab, (context,), generator=gen).tolist())
    times: dict[int, list[float]] = {b: [] for b in batches}
    one = torch.ones(1, 1, dtype=torch.bool)
    for rep in range(repeats + 1):  # the first round warms up and is dropped
        for b in batches:
            cache.select(0, b)
            parts = [Rows(torch.randint(0, vocab, (1,), generator=gen), torch.tensor([context]), one,
                          torch.tensor([0])) for _ in range(b)]
            t0 = time.perf_counter()
            runner.model.forward_batch(cache, parts)
            if rep:
                times[b].append(time.perf_counter() - t0)
            for slot in range(b):  # back to the prefix
                cache.keep(context, torch.empty(0, dtype=torch.long), slot)
    return {b: statistics.median(v) for b, v in times.items()}


def max_batch_from(seconds: Mapping[int, float], gain: float = GAIN) -> int:
    """The smallest measured batch whose next measured size raises throughput (B / t(B)) by less than
    `gain`; the largest measured size when every step up pays."""
    sizes = sorted(seconds)
    for small, large in zip(sizes, sizes[1:]):
        if (large / seconds[large]) < gain * (small / seconds[small]):
            return small
    return sizes[-1]


def default_max_batch(loaded: LoadedModel, remeasure: bool = False) -> tuple[int, dict[int, float] | None]:
    """(max batch, the timings it came from) for this model, dtype and device; timed once (a few
    seconds) and cached beside the cost curves. Models flagged as having meaningless timings get
    FALLBACK and no timings."""
    if getattr(loaded.model, "_lookahead_flat_costs", False):
        return FALLBACK, None
    path = cache_root() / "batch-costs.json"
    key = f"{loaded.timing_key}|context={MEASURE_CONTEXT}|v{VERSION}"
    stored = None if remeasure else read_json(path).get(key)
    try:
        seconds = {int(b): float(t) for b, t in stored.items()}  # type: ignore[union-attr]
    except (AttributeError, TypeError, ValueError):
        runner = StepRunner(loaded.model, None, width_probe(loaded.model))
        vocab = int(loaded.model.get_output_embeddings().weight.shape[0])
        seconds = measure_batches(runner, vocab)
        update_json(path, key, {str(b): t for b, t in seconds.items()})
    return max_batch_from(seconds), seconds
