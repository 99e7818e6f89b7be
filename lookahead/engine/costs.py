"""The device's cost curve: how long one forward pass of k query rows takes, relative to one row.

Speculation pays only where verifying k guesses costs less than the tokens they are expected to settle,
so every allocation decision (engine/allocator.py) reads this curve. It is measured once per (model,
dtype, device, floor) by `measure` (`lookahead.load` and `lookahead profile` measure it on first use and
cache it in ~/.cache/lookahead/cost-curves.json), and refined by the engine from its own step
timings (`observe`), since the context length, the thread count and the load on the machine all move it.

Widths are query rows after padding: a pass padded to a width floor costs what the floor costs, so
rows below the floor are free (the allocator fills them).

Key views (engine/attention.py): an exact pass that verifies tree branches recomputes their attention
over gathered keys in every layer. That work hardly depends on the width and is mostly fixed per pass
(small operations, one per layer each), so the curve carries it as one surcharge, `views`, in units of
a one-row pass: `with_views(k)` = c(k) + views, refined from the engine's timings like the rest.
"""

from __future__ import annotations

import bisect
import math
import weakref
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from lookahead.cachefile import read_json, update_json
from lookahead.engine.draft import CandidateTree
from lookahead.engine.kvcache import KVCache
from lookahead.engine.model_runner import Rows
from lookahead.engine.numerics import KEY_ALIGN
from lookahead.engine.query import build_query

CURVE_VERSION = 9  # 3: rounds scaled by their own mean; 4: keys padded to 256; 5: per-device key chunks;
# 6: exact bfloat16 passes on the C++ kernel (engine/exact_kernel.py); 7: its own softmax; 8: its scores
# over dimension pairs (scores_kernel.cpp); 9: its attention in one call, stacked projections in one call
# each (wider passes gained more); older: re-timed. Passes through the lean forward (models/lean.py)
# are timed apart from the model's own forward's (`lean` in the key)
DEFAULT_WIDTHS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
MEASURE_CONTEXT = 256  # cached tokens under the timed passes
VIEWS_WIDTH = 9  # rows of the timed pass with a key view (root + two chains of 5 and 3 nodes)
VIEWS_ROUNDS = 4  # the views surcharge is timed over at least 3x this many rounds
PRIOR_STEPS = 2.0  # `observe`: the measured curve's weight against a width's observed steps, in steps


class CostCurve:
    """Relative cost c(k) = t(k) / t(1) for k query rows, piecewise linear between measured widths and
    linear beyond the widest. `floor`: passes are padded to it, so c(k) = c(floor) for k < floor."""

    def __init__(self, relative: Mapping[int, float], floor: int | None = None, decay: float = 0.9,
                 learns: bool = True, views: float = 0.0) -> None:
        if not relative or 1 not in relative or any(k < 1 or v <= 0 for k, v in relative.items()):
            raise ValueError(f"a cost curve needs positive costs at widths >= 1 including 1, got {dict(relative)}")
        self.widths = sorted(relative)
        self.costs = [relative[k] / relative[1] for k in self.widths]
        self.floor = floor
        self.decay = decay
        self.learns = learns  # False: `observe` changes nothing (a fixed curve keeps allocations reproducible)
        if views < 0:
            raise ValueError(f"the key views' surcharge must be >= 0, got {views}")
        self.views = views  # extra cost of a pass with key views, in one-row passes
        self._scale: float | None = None  # EMA of seconds per unit of relative cost (t(1) in seconds)
        # (width, key views) -> decayed sums of observed / predicted and of observations, and the prior's weight
        # (its correction: see observe)
        self._sums: dict[tuple[int, bool], tuple[float, float, float]] = {}
        self._seen: dict[bool, list[int]] = {False: [], True: []}  # key views -> observed widths, ascending
        self._cheapest: list[tuple[int, float]] | None = None  # [i]: the cheapest of widths[i:] (see pad_to)
        self._known: dict[tuple[int, bool], float] = {}  # `_learned` until the next observed step

    def __call__(self, width: int, most: int | None = None) -> float:
        """Relative cost of a pass of `width` rows (only ratios between widths matter): the cost of the
        width it runs at, the cheapest it can be padded to within `most` rows (see `pad_to`)."""
        return self._cost(self.pad_to(width, most))

    def with_views(self, width: int, most: int | None = None) -> float:
        """Relative cost of a pass of `width` rows in which tree branches are verified over key views."""
        return self._learned(self.pad_to(width, most), True)

    def _cost(self, k: int) -> float:
        return self._learned(k, False)

    def _learned(self, k: int, views: bool) -> float:
        known = self._known.get((k, views))
        if known is None:
            known = self._known[(k, views)] = self._correct(k, views)
        return known

    def _correct(self, k: int, views: bool) -> float:
        """A width's cost as the engine's timings have corrected it. A width never observed between two
        observed ones costs at most the line between their corrected costs: the measured curve (a few
        noisy rounds, maybe from another day's load) may price it too high, and a width the allocator
        never picks would never be timed to correct that (SmolLM2 bf16 here: 6 rows stored at 1.42, 8
        at 1.45, so code requests ran 4 or 8 rows and 6 was never timed). The first steps run there
        correct it (see `observe`). The line is not followed below the narrower width's cost: where
        a wider width was timed cheaper (noise, or a kernel's real dip), padding already goes there, and a
        one-row step must not leave its width for an untimed one on a guess."""
        base = self._base(k) + (self.views if views else 0.0)
        sums = self._sums.get((k, views))
        if sums is not None:
            ratio, steps, prior = sums
            return base * (prior + ratio) / (prior + steps)
        seen = self._seen[views]
        i = bisect.bisect_left(seen, k)
        if 0 < i < len(seen):  # observed widths on both sides
            lo, hi = seen[i - 1], seen[i]
            c_lo, c_hi = self._learned(lo, views), self._learned(hi, views)
            return min(base, max(c_lo + (k - lo) / (hi - lo) * (c_hi - c_lo), c_lo))
        return base

    def pad_to(self, width: int, most: int | None = None) -> int:
        """The width to run `width` rows at: itself, or a wider measured width that costs less. Some
        kernels are not monotone in the number of rows (float32 MKL here: 8 rows cost less than 4;
        bfloat16 oneDNN: 3 rows less than 1), and dummy rows are free to add, so a pass is padded to the
        cheapest width at or above its own, and at most `most` (None: no limit)."""
        k = max(width, self.floor or 1, 1)
        wider = self._cheapest_from(k)
        if most is None or wider <= max(most, k):
            return wider
        within = [w for w in self.widths if k < w <= most]  # ascending: ties go to the narrower width
        best = min(within, key=self._cost, default=k)
        return best if self._cost(best) < self._cost(k) else k

    def padded(self, widths: Iterable[int], most: int | None = None) -> list[int]:
        """`pad_to(w, most)` for each of `widths`, in one sweep over the measured widths: the allocator
        prices every width it may run (up to ~40) each step, and the curve changes after every step.
        Each w runs at the cheapest measured width in (k, most] (k: w raised to the floor; narrowest on
        ties) where that costs less than k itself; that is what `pad_to` gives, whether or not the
        cheapest of all wider widths lies past `most`."""
        wider = self.widths if most is None else self.widths[: bisect.bisect_right(self.widths, most)]
        best: list[tuple[int, float]] = [(0, math.inf)] * (len(wider) + 1)  # [i]: the cheapest of wider[i:]
        for j in range(len(wider) - 1, -1, -1):
            c = self._cost(wider[j])
            best[j] = (wider[j], c) if c <= best[j + 1][1] else best[j + 1]  # ties go to the narrower width
        out = []
        for w in widths:
            k = max(w, self.floor or 1, 1)
            at, c = best[bisect.bisect_right(wider, k)]
            out.append(at if c < self._cost(k) else k)
        return out

    def _cheapest_from(self, k: int) -> int:
        """The cheapest width at or above k: k itself or a wider measured width."""
        i = bisect.bisect_right(self.widths, k)
        if i == len(self.widths):
            return k
        if self._cheapest is None:  # the allocator prices every width each step: one sweep per refinement
            self._cheapest = [(0, 0.0)] * len(self.widths)
            best = (0, float("inf"))
            for j in range(len(self.widths) - 1, -1, -1):
                c = self._cost(self.widths[j])
                if c <= best[1]:  # ties go to the narrower width
                    best = (self.widths[j], c)
                self._cheapest[j] = best
        wider, wider_cost = self._cheapest[i]
        return wider if wider_cost < self._cost(k) else k

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

    def observe(self, width: int, seconds: float, views: bool = False) -> None:
        """Refine from one step's forward time at `width` rows (before padding; `views`: the pass had key
        views). The scale (seconds per unit of the measured curve) follows every step; each width's
        correction, with and without views, follows its own steps, so the ratios between the passes the
        engine actually runs come from the engine's own timings."""
        if not self.learns:
            return
        k = max(width, self.floor or 1, 1)  # the width that ran (after padding)
        base, d = self._base(k) + (self.views if views else 0.0), self.decay
        unit = seconds / base
        self._scale = unit if self._scale is None else d * self._scale + (1 - d) * unit
        # The correction: a decayed mean of observed / predicted, beside a prior of 1 (the measured curve)
        # worth PRIOR_STEPS steps that decays like them, so a width's first steps already move it
        # (a fixed weight of 1 / (1 - decay) = 10 steps made a mispriced width that is rarely run
        # look right until ten steps had run there).
        key = (k, views)
        ratio, steps, prior = self._sums.get(key, (0.0, 0.0, PRIOR_STEPS))
        ratio, steps, prior = d * ratio + unit / self._scale, d * steps + 1.0, d * prior
        self._sums[key] = (ratio, steps, prior)  # the correction: (prior + ratio) / (prior + steps)
        if k not in self._seen[views]:
            bisect.insort(self._seen[views], k)
        self._cheapest = None
        self._known.clear()

    @property
    def seconds_per_unit(self) -> float | None:
        """Estimated seconds of a one-row pass right now (None before any step was timed)."""
        return self._scale

    def to_json(self) -> dict[str, float]:
        out = {str(k): round(c, 4) for k, c in zip(self.widths, self.costs)}
        return {**out, "views": round(self.views, 4)} if self.views else out

    @classmethod
    def from_json(cls, stored: Mapping[str, float], floor: int | None = None) -> CostCurve:
        return cls({int(k): float(v) for k, v in stored.items() if k != "views"}, floor,
                   views=float(stored.get("views", 0.0)))

    @classmethod
    def flat(cls, floor: int | None = None) -> CostCurve:
        """Every width costs the same: what a bandwidth-bound device looks like far below its knee. It
        does not learn from timings, so what the test models decide does not depend on the machine's load."""
        return cls({1: 1.0, 1024: 1.0}, floor, learns=False)


class Price:
    """A curve's c(w) as the allocator reads it: a pass of w rows as it runs, padded within `most` rows
    (None: no limit), with key views (`views`) or without. `many` prices a list of widths in one sweep."""

    def __init__(self, curve: CostCurve, most: int | None = None, views: bool = False) -> None:
        self.curve, self.most, self.views = curve, most, views

    def __call__(self, width: int) -> float:
        return self.curve._learned(self.curve.pad_to(width, self.most), self.views)

    def many(self, widths: Sequence[int]) -> list[float]:
        return [self.curve._learned(k, self.views) for k in self.curve.padded(widths, self.most)]


def measure(model: Any, runner: Any, widths: Sequence[int] = DEFAULT_WIDTHS, repeats: int = 8,
            context: int = MEASURE_CONTEXT, clock: Callable[[], float] = time.perf_counter) -> dict[int | str, float]:
    """Seconds of one pass of k rows over `context` cached tokens, per k, through the engine's own model
    runner (so padding, exact attention and the LM head rows are what decoding pays). A shared or
    throttled machine changes speed over seconds, by more than the widths differ, so every round times
    each width once (in alternating order) and is scaled by its own geometric mean: a width's figure is
    the median over rounds of its share of the round, times the median round. Where the
    runner verifies branches over key views, also "views": the median over rounds of what a pass of
    VIEWS_WIDTH rows whose tree has a second chain off the root (one view) costs more than a chain of
    that width timed next to it (a paired difference: the surcharge is small beside the pass).
    `clock`: the timer (a test passes a simulated one)."""
    ceiling = getattr(runner, "ceiling", None)  # no exact pass is run (or timed) wider than the probe's ceiling
    widths = [k for k in widths if ceiling is None or k <= ceiling]
    vocab = model.get_output_embeddings().weight.shape[0]
    gen = torch.Generator().manual_seed(0)
    cache = KVCache(KEY_ALIGN if runner.floor else 1)
    runner.prefill(cache, torch.randint(0, vocab, (context,), generator=gen).tolist())
    passes: dict[int | str, Rows] = {}
    for k in widths:
        passes[k] = Rows(torch.randint(0, vocab, (k,), generator=gen), torch.arange(context, context + k),
                         torch.ones(k, k, dtype=torch.bool).tril_(), torch.arange(k))
    if getattr(runner, "views", False):
        tree = CandidateTree()
        for branch in ([1, 2, 3, 4, 5], [6, 7, 8]):  # the first chain, then a branch off the root: one view
            tree.add(branch)
        q = build_query(0, context, tree, None, views=True)
        passes["views"] = Rows(q.tokens, q.positions, q.local, q.keep, q.views)
        chain = build_query(0, context, tree.first_chain(), None)
        chain_tokens = torch.cat([chain.tokens, q.tokens[chain.width:]])  # the same tokens, one causal chain
        passes["chain"] = Rows(chain_tokens, torch.arange(context, context + VIEWS_WIDTH),
                               torch.ones(VIEWS_WIDTH, VIEWS_WIDTH, dtype=torch.bool).tril_(), torch.arange(VIEWS_WIDTH))
    times: dict[int | str, list[float]] = {k: [] for k in passes}
    rounds = repeats if "views" not in passes else max(repeats, 3 * VIEWS_ROUNDS)
    for rep in range(rounds + 1):  # the first round warms up and is dropped
        for k, rows in list(passes.items())[:: 1 if rep % 2 else -1]:  # alternate: a drift cancels out
            if rep > repeats and isinstance(k, int):
                continue  # the extra rounds time the views surcharge only
            t0 = clock()
            runner.forward_batch(cache, [rows])
            if rep:
                times[k].append(clock() - t0)
            cache.crop(context - cache.get_seq_length())
    # [round][width] log seconds; each round less its mean: the widths' log shares of that round
    logs = [[math.log(max(t, 1e-9)) for t in r] for r in zip(*(times[k] for k in widths))]  # a coarse clock may read 0
    shares = [[x - statistics.fmean(r) for x in r] for r in logs]
    typical = statistics.median(statistics.fmean(r) for r in logs)
    out: dict[int | str, float] = {k: math.exp(typical + statistics.median(r[i] for r in shares))
                                   for i, k in enumerate(widths)}
    if "views" in times:
        out["views"] = statistics.median(v - c for v, c in zip(times.pop("views"), times.pop("chain")))
    return out


def curve_from(seconds: Mapping[int | str, float], floor: int | None = None) -> CostCurve:
    """The curve of `measure`'s timings; "views" (seconds a views pass costs more than a chain of its
    width) becomes the surcharge in one-row passes (never below 0)."""
    widths = {k: v for k, v in seconds.items() if isinstance(k, int)}
    return CostCurve(widths, floor, views=max(0.0, seconds.get("views", 0.0) / widths[1]))


_CURVES: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], CostCurve]] = weakref.WeakKeyDictionary()


def cost_curve(model: Any, runner: Any, cache_file: Path | None = None, cache_key: str = "",
               remeasure: bool = False) -> CostCurve:
    """The model's curve for passes run by `runner` (its floor and attention), shared by every request
    on the model so that each one refines it. Measured on first use (a few seconds) unless `cache_file`
    holds it under `cache_key`; a model without a cache file entry whose timings mean nothing (the
    random-weight test models, `flat=True` in lookahead.testing) gets the flat curve. `remeasure`:
    measure now and overwrite what is stored (`lookahead profile`)."""
    per_model = _CURVES.setdefault(model, {})
    quantum = getattr(runner, "quantum", 1)
    lean = getattr(runner, "lean", None) is not None  # the lean forward's passes cost otherwise (models/lean.py)
    kind = (runner.floor, runner.exact_attention, getattr(runner, "views", False), quantum, lean)
    if kind in per_model and not remeasure:
        return per_model[kind]
    if getattr(model, "_lookahead_flat_costs", False):
        curve = CostCurve.flat(runner.floor)
    else:
        key = (f"{cache_key}|floor={runner.floor}|exact={runner.exact_attention}|views={getattr(runner, 'views', False)}"
               f"|quantum={quantum}|chunk={getattr(runner, 'key_chunk', 0)}|lean={lean}|v{CURVE_VERSION}")
        stored = read_json(cache_file).get(key) if cache_file is not None and not remeasure else None
        try:
            curve = CostCurve.from_json(stored, runner.floor)  # type: ignore[arg-type]
        except (AttributeError, TypeError, ValueError):
            curve = curve_from(measure(model, runner), runner.floor)
            if cache_file is not None:
                update_json(cache_file, key, curve.to_json())
    per_model[kind] = curve
    return curve
