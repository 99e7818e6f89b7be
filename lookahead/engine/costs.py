"""The device's cost curve: how long one forward pass of k query rows takes, relative to one row.

Speculation pays only where verifying k guesses costs less than the tokens they are expected to settle,
so every allocation decision (engine/allocator.py) reads this curve. It is measured once per (model,
dtype, device, floor) by `measure` (`lookahead.load` and `lookahead profile` measure it on first use and
cache it in ~/.cache/lookahead/cost-curves.json), and refined by the engine from its own step
timings (`observe`), since the context length, the thread count and the load on the machine all move it.

Widths are query rows after padding: a pass padded to a width floor costs what the floor costs, so
rows below the floor are free (the allocator fills them).
"""

from __future__ import annotations

import bisect
import weakref
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from lookahead.cachefile import read_json, update_json
from lookahead.engine.kvcache import KVCache
from lookahead.engine.numerics import KEY_ALIGN

CURVE_VERSION = 1
DEFAULT_WIDTHS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
MEASURE_CONTEXT = 256  # cached tokens under the timed passes


class CostCurve:
    """Relative cost c(k) = t(k) / t(1) for k query rows, piecewise linear between measured widths and
    linear beyond the widest. `floor`: passes are padded to it, so c(k) = c(floor) for k < floor."""

    def __init__(self, relative: Mapping[int, float], floor: int | None = None, decay: float = 0.9,
                 learns: bool = True) -> None:
        if not relative or 1 not in relative or any(k < 1 or v <= 0 for k, v in relative.items()):
            raise ValueError(f"a cost curve needs positive costs at widths >= 1 including 1, got {dict(relative)}")
        self.widths = sorted(relative)
        self.costs = [relative[k] / relative[1] for k in self.widths]
        self.floor = floor
        self.decay = decay
        self.learns = learns  # False: `observe` changes nothing (a fixed curve keeps allocations reproducible)
        self._scale: float | None = None  # EMA of seconds per unit of relative cost (t(1) in seconds)
        self._fixes: dict[int, float] = {}  # width -> EMA of observed / predicted

    def __call__(self, width: int) -> float:
        """Relative cost of a pass of `width` rows (only ratios between widths matter): the cost of the
        cheapest width it can be padded to (see `pad_to`)."""
        return self._cost(self.pad_to(width))

    def _cost(self, k: int) -> float:
        return self._base(k) * self._fixes.get(k, 1.0)

    def pad_to(self, width: int) -> int:
        """The width to run `width` rows at: itself, or a wider measured width that costs less. Some
        kernels are not monotone in the number of rows (float32 MKL here: 8 rows cost less than 4), and
        dummy rows are free to add, so a pass is padded to the cheapest width at or above its own."""
        k = max(width, self.floor or 1, 1)
        best, best_cost = k, self._cost(k)
        for w in self.widths[bisect.bisect_right(self.widths, k):]:
            c = self._cost(w)
            if c < best_cost:
                best, best_cost = w, c
        return best

    def _base(self, k: int) -> float:
        ws, cs = self.widths, self.costs
        i = bisect.bisect_left(ws, k)
        if i < len(ws) and ws[i] == k:
            return cs[i]
        if i == len(ws):  # past the widest measured width: extend the last segment's slope
            if len(ws) == 1:
                return cs[0] * k
            slope = max((cs[-1] - cs[-2]) / (ws[-1] - ws[-2]), 0.0)
            return cs[-1] + slope * (k - ws[-1])
        lo, hi = i - 1, i
        frac = (k - ws[lo]) / (ws[hi] - ws[lo])
        return cs[lo] + frac * (cs[hi] - cs[lo])

    def observe(self, width: int, seconds: float) -> None:
        """Refine from one step's forward time at `width` rows (before padding). The scale (seconds per
        unit of the measured curve) follows every step; each width's correction follows its own steps,
        so the ratios between the widths the engine actually runs come from the engine's own timings."""
        if not self.learns:
            return
        k = max(width, self.floor or 1, 1)  # the width that ran (after padding)
        base, d = self._base(k), self.decay
        unit = seconds / base
        self._scale = unit if self._scale is None else d * self._scale + (1 - d) * unit
        self._fixes[k] = d * self._fixes.get(k, 1.0) + (1 - d) * unit / self._scale

    @property
    def seconds_per_unit(self) -> float | None:
        """Estimated seconds of a one-row pass right now (None before any step was timed)."""
        return self._scale

    def to_json(self) -> dict[str, float]:
        return {str(k): round(c, 4) for k, c in zip(self.widths, self.costs)}

    @classmethod
    def flat(cls, floor: int | None = None) -> CostCurve:
        """Every width costs the same: what a bandwidth-bound device looks like far below its knee. It
        does not learn from timings, so what the test models decide does not depend on the machine's load."""
        return cls({1: 1.0, 1024: 1.0}, floor, learns=False)


def measure(model: Any, runner: Any, widths: Sequence[int] = DEFAULT_WIDTHS, repeats: int = 3,
            context: int = MEASURE_CONTEXT) -> dict[int, float]:
    """Median seconds of one pass of k rows over `context` cached tokens, per k, through the engine's own
    model runner (so padding, exact attention and the LM head rows are what decoding pays)."""
    vocab = model.get_output_embeddings().weight.shape[0]
    gen = torch.Generator().manual_seed(0)
    cache = KVCache(KEY_ALIGN if runner.floor else 1)
    runner.prefill(cache, torch.randint(0, vocab, (context,), generator=gen).tolist())
    times: dict[int, list[float]] = {k: [] for k in widths}
    for rep in range(repeats + 1):  # the first round warms up and is dropped
        for k in widths:
            tokens = torch.randint(0, vocab, (k,), generator=gen)
            positions = torch.arange(context, context + k)
            local = torch.ones(k, k, dtype=torch.bool).tril_()
            t0 = time.perf_counter()
            runner.forward(cache, tokens, positions, local, torch.arange(k))
            if rep:
                times[k].append(time.perf_counter() - t0)
            cache.crop(context - cache.get_seq_length())
    return {k: statistics.median(v) for k, v in times.items()}


_CURVES: weakref.WeakKeyDictionary[Any, dict[tuple[int | None, bool], CostCurve]] = weakref.WeakKeyDictionary()


def cost_curve(model: Any, runner: Any, cache_file: Path | None = None, cache_key: str = "",
               remeasure: bool = False) -> CostCurve:
    """The model's curve for passes run by `runner` (its floor and attention), shared by every request
    on the model so that each one refines it. Measured on first use (a few seconds) unless `cache_file`
    holds it under `cache_key`; a model without a cache file entry whose timings mean nothing (the
    random-weight test models, `flat=True` in lookahead.testing) gets the flat curve. `remeasure`:
    measure now and overwrite what is stored (`lookahead profile`)."""
    per_model = _CURVES.setdefault(model, {})
    kind = (runner.floor, runner.exact_attention)
    if kind in per_model and not remeasure:
        return per_model[kind]
    if getattr(model, "_lookahead_flat_costs", False):
        curve = CostCurve.flat(runner.floor)
    else:
        key = f"{cache_key}|floor={runner.floor}|exact={runner.exact_attention}|v{CURVE_VERSION}"
        stored = read_json(cache_file).get(key) if cache_file is not None and not remeasure else None
        try:
            curve = CostCurve({int(k): float(v) for k, v in stored.items()}, runner.floor)  # type: ignore[union-attr]
        except (AttributeError, TypeError, ValueError):
            curve = CostCurve(measure(model, runner), runner.floor)
            if cache_file is not None:
                update_json(cache_file, key, curve.to_json())
    per_model[kind] = curve
    return curve
