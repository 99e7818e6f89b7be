"""The default max batch: where a batched pass's throughput stops growing (scheduler/batch_costs.py)."""

from __future__ import annotations

import pytest
import torch

from lookahead.engine.numerics import width_probe
from lookahead.engine.step import StepRunner
from lookahead.scheduler.batch_costs import BATCHES, FALLBACK, default_max_batch, max_batch_from, measure_batches
from lookahead.testing import tiny_model


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        # Throughput B/t: 1, 2, 3.6, 5.3, 5.0: going from 8 to 16 lowers it, so 8.
        ({1: 1.0, 2: 1.0, 4: 1.1, 8: 1.5, 16: 3.2}, 8),
        # A flat device: every doubling doubles throughput, so the largest size measured.
        ({1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0}, 8),
        # Compute-bound from the start: t grows with B, throughput stays 1, so no batching.
        ({1: 1.0, 2: 2.0, 4: 4.0}, 1),
        # 4 -> 8 gains 5% (< 10%): not worth doubling every request's step time, so 4.
        ({1: 1.0, 2: 1.2, 4: 1.6, 8: 3.05}, 4),
    ],
)
def test_max_batch_is_where_doubling_stops_paying(seconds: dict[int, float], expected: int) -> None:
    assert max_batch_from(seconds) == expected


def test_batched_passes_are_timed_for_every_size_and_leave_the_cache_as_found() -> None:
    lm = tiny_model("llama")
    runner = StepRunner(lm.model, None, width_probe(lm.model))
    seconds = measure_batches(runner, lm.model.get_output_embeddings().weight.shape[0], batches=(1, 2, 4),
                              repeats=1, context=16)
    assert sorted(seconds) == [1, 2, 4] and all(t > 0 for t in seconds.values())


def test_models_whose_timings_mean_nothing_get_the_fallback() -> None:
    assert default_max_batch(tiny_model("llama")) == (FALLBACK, None)
    assert max(BATCHES) >= FALLBACK
