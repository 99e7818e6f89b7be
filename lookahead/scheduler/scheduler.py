"""The scheduler: one forward pass per step for every active request (continuous batching).

    1. admit: prefill each new request into a free cache slot (its own pass, after the longest stored
       prefix of its prompt where a prefix cache is given: engine/prefix_cache.py), up to `max_batch`
    2. propose: every active request's candidate tree from its own sources
    3. allocate: one budget for the step (engine/allocator.py, `allocate_batch`): every request gets its
       root row; the pass is as wide as pays off on the device's cost curve across all of them
    4. step: one pass for all (engine/step.py, `step_batch`); each request sees only its own slot
    5. absorb: stop rules, emit, update the sources; finished or cancelled requests leave between steps

A request's tokens do not depend on its companions: its rows see only its own keys, and every pass is
padded to the model's width floor, above which a row's logits do not depend on the pass's width
(engine/numerics.py). At low load the budget goes to speculation; as requests fill the batch, the
root rows use it up and the step becomes plain batched decoding.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from lookahead.engine import exact_kernel
from lookahead.engine.allocator import allocate_batch
from lookahead.engine.costs import CostCurve, Price, cost_curve
from lookahead.engine.draft import Draft
from lookahead.engine.numerics import width_probe
from lookahead.engine.prefix_cache import PrefixCache, split_exact
from lookahead.engine.shared import shared
from lookahead.engine.sources import WantsStates
from lookahead.engine.step import StepRunner
from lookahead.errors import ConfigError
from lookahead.models.loader import LoadedModel
from lookahead.models.registry import cache_root
from lookahead.scheduler.request import Request, StepEvent


@dataclass(frozen=True)
class SchedulerConfig:
    """max_batch: requests decoded together (cache slots); max_rows: most query rows one pass may carry
    across all requests (None: as many as the cost curve says pay, up to each request's widest step;
    exact passes are also padded with dummy rows up to a cheaper width, unpadded ones only within that step);
    exact: pad passes to the model's width floor so that every token is bit-identical to decoding the
    request alone (False: unpadded, identical only up to float rounding); widest: the widest step a
    request may take (sizes the width probe); key_views: exact steps may verify tree branches over key
    views where the width probe found them exact (engine/attention.py; False, the default: each tree's
    first chain only, the faster choice measured on this project's CPUs); aligned_trees: exact steps verify
    whole trees with their keys at aligned offsets where the probe found that exact (engine/query.py
    align_tree; costs masked keys only; on by default: on the 2-core Zen 4 it raised tokens per step 6-17%
    in every class, median paired speed 1.03x over 100 held-out requests; False: first chains only;
    docs/measurements.md, "Measured: exact trees at aligned key offsets")."""

    max_batch: int = 8
    max_rows: int | None = None
    exact: bool = True
    widest: int = 64
    key_views: bool = False
    aligned_trees: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.max_batch, int) or self.max_batch < 1:
            raise ConfigError(f"max_batch must be an integer >= 1, got {self.max_batch!r}")
        if self.max_rows is not None and (not isinstance(self.max_rows, int) or self.max_rows < self.max_batch):
            raise ConfigError(f"max_rows must be an integer >= max_batch ({self.max_batch}) so that every request "
                              f"gets its root row, got {self.max_rows!r}")
        if not isinstance(self.widest, int) or self.widest < 1:
            raise ConfigError(f"widest must be an integer >= 1, got {self.widest!r}")
        if not isinstance(self.key_views, bool):
            raise ConfigError(f"key_views must be True or False, got {self.key_views!r}")
        if not isinstance(self.aligned_trees, bool):
            raise ConfigError(f"aligned_trees must be True or False, got {self.aligned_trees!r}")


@dataclass(frozen=True)
class StepReport:
    """What one scheduler step did: requests in the pass, query rows (padded), of them speculative
    (candidate and aux rows granted), and the pass's seconds."""

    batch: int
    rows: int
    speculative_rows: int
    forward_s: float


class Scheduler:
    """Decodes many requests of one model together. Not thread-safe: one thread calls add/cancel/step.
    `prefix_cache`: prompt prefixes to reuse and to store each prompt in (None: every prompt prefills
    whole); it is used only where this model's prefill splits exactly (`prefix_cache.split_exact`, checked
    once per model in the process), so reuse never changes a token."""

    def __init__(self, loaded: LoadedModel, config: SchedulerConfig | None = None,
                 prefix_cache: PrefixCache | None = None) -> None:
        self.config = config or SchedulerConfig()
        self.loaded = loaded
        numerics = width_probe(loaded.model, self.config.widest) if self.config.exact else None
        self.probe_width = numerics.max_width if numerics is not None else 0  # widths the probe vouches for
        self.runner = StepRunner(loaded.model, None, numerics, key_views=self.config.key_views,
                                 aligned=self.config.aligned_trees)
        model = self.runner.model
        if not model.fits(self.config.max_batch):
            raise ConfigError(f"{self.config.max_batch} requests of at least {model.row_floor(self.config.max_batch)} "
                              f"rows each do not fit the widest exact pass on this device ({model.ceiling} rows, "
                              "engine/numerics.py): lower max_batch, or pass exact=False to run unpadded")
        self.curve = device_costs(loaded, self.runner)
        self.cache = self.runner.new_cache(self.config.max_batch)
        if prefix_cache is not None:
            prefix_cache.bind(loaded.model)
        self.prefix = prefix_cache if prefix_cache is not None and prefix_cache.max_bytes and self._splits(
            prefix_cache.block) else None
        self.active: list[Request] = []  # active[i] lives in cache slot i
        self.last: StepReport | None = None

    @property
    def free_slots(self) -> int:
        return self.config.max_batch - len(self.active)

    @property
    def kv_tokens(self) -> int:
        """Cached tokens of the active requests."""
        return sum(len(r.context) - 1 for r in self.active)

    # 1. Admit.
    def add(self, request: Request) -> None:
        """Prefill `request` into the next free slot; it joins the next step."""
        if not self.free_slots:
            raise RuntimeError(f"the batch is full ({self.config.max_batch} requests); wait for one to finish")
        if self.config.exact and request.cfg.widest_step > self.probe_width:
            self._widen(request.cfg.widest_step)
        slot = len(self.active)
        self.cache.clear(slot)
        self.cache.select(slot, slot + 1)
        request.started = time.perf_counter()
        spent = self.runner.timer.seconds
        # all prompt tokens but the last (the first root), after the longest stored prefix of them (none
        # where its sources want every prompt token's final hidden states); then the prompt is stored
        cached, tokens = 0, request.prompt_ids[:-1]
        if self.prefix is not None and not request.states:
            # a rest shorter than the width floor would be padded, which takes it off the causal kernel
            cached, kv = self.prefix.match(tokens, least=self.runner.model.row_floor(1))
            if cached:
                self.cache.load(slot, kv)
        states = self.runner.prefill(self.cache, request.prompt_ids, request.states, cached)
        if states is not None and isinstance(request.proposer, WantsStates):
            request.proposer.observe_states(0, states)
        if self.prefix is not None:
            self.prefix.store(tokens, self.cache, slot)
        request.stats.cached_tokens = cached
        request.device_s += self.runner.timer.seconds - spent
        request.decode_started = time.perf_counter()
        request.stats.prefill_s = request.decode_started - request.started
        self.active.append(request)

    def _splits(self, block: int) -> bool:
        """Does this model's prefill give the same bits whole and split at multiples of `block` (once per
        model, block and kernel choice in the process)?"""
        model = self.runner.model
        windows = [w for w in model.masks.kinds.values() if w is not None]
        vocab = self.loaded.model.get_output_embeddings().weight.shape[0]
        return bool(shared(self.loaded.model, "prefix-split-exact", f"{block}/{exact_kernel.status()}/prefill kernel {exact_kernel.enabled(exact_kernel.PREFILL_ENV)}",
                           lambda: split_exact(model, lambda: self.runner.new_cache(1), vocab, block,
                                               max(windows, default=None))))

    def _widen(self, width: int) -> None:
        """A request may take wider steps than the probe covered: probe wider (once per model). The
        padding must not change under the requests already decoding."""
        numerics = width_probe(self.loaded.model, width)
        model = self.runner.model
        if model.floor is not None and ((numerics.floor, numerics.batch_exact, numerics.quantum)
                                        != (model.floor, model.batch_exact, model.quantum)
                                        or numerics.widest_exact < (model.ceiling or self.probe_width)):
            raise RuntimeError(f"probing {width}-row steps moved the width floor from {model.floor} to "
                               f"{numerics.floor} (widest exact pass {numerics.widest_exact} rows); start the "
                               f"scheduler with widest >= {width}")
        if model.floor is not None:
            model.ceiling = numerics.ceiling
        self.probe_width = numerics.max_width

    def remove(self, request: Request) -> None:
        """Retire `request` (finished or cancelled); the last slot's request moves into its slot."""
        slot = self.active.index(request)
        last = len(self.active) - 1
        if slot != last:
            self.cache.move(last, slot)
            self.active[slot] = self.active[last]
        self.cache.clear(last)
        self.active.pop()

    def step(self) -> list[tuple[Request, StepEvent]]:
        """One pass for every active request. Returns the events to deliver, in request order; a
        request's final event (with its result) comes in the step it finishes, and it leaves the batch."""
        if not self.active:
            return []
        batch = len(self.active)
        # 2. Propose.
        ceiling = self.runner.model.ceiling  # the widest exact pass (engine/numerics.py; None: no limit)
        room = self.runner.model.room(batch)  # a pass is rectangular: batch x room rows at most
        wanted = [r.propose(self.runner.chain_only, batched=batch > 1, verifiable=self.runner.verifiable, room=room)
                  for r in self.active]
        # 3. Allocate one budget across the batch.
        widest = max(c.max_width for c in wanted)
        max_rows = self.config.max_rows if ceiling is None else min(self.config.max_rows or ceiling, ceiling)
        # Rows up to a cheaper width are free. An exact pass (every width from the floor on computes each row
        # alike) goes to the cheapest width at or above its own within max_rows, even a one-row autoregressive
        # step (SmolLM2 bf16, 2 Zen 4 cores: oneDNN's linears run 3 rows in 0.88 of one row's time); an
        # unpadded pass, whose rows may change with the width, never goes wider than the requests' own widest.
        # The allocator prices each width as it will run: padded within the same limit.
        limit = max_rows if self.runner.model.floor else widest * batch
        curve = self.curve
        price = Price(curve, limit)
        views = Price(curve, limit, views=True) if self.runner.views else None
        plans = allocate_batch(wanted, price, max_width=max(widest, max(c.fixed or 1 for c in wanted)),
                               max_rows=max_rows, views_cost=views)
        # A request its realization priced out of speculating still learns what its guesses would have
        # delivered: the nodes it would have verified at face value, scored on the tokens that follow.
        for request, want, plan in zip(self.active, wanted, plans):
            if not plan.nodes and want.fixed is None and len(want.tree) and request.realization < 1.0:
                face = allocate_batch([replace(want, probs=want.tree.probs)], price, max_width=want.max_width,
                                      max_rows=max_rows, views_cost=views)[0]
                request.shadow(face.nodes)
        items = [r.item(plan) for r, plan in zip(self.active, plans)]
        self.runner.pad_to = lambda k: curve.pad_to(k, limit)
        # 4. One pass.
        self.cache.select(0, batch)
        outcomes = self.runner.step_batch(self.cache, items)
        rows = sum(o.query_tokens for o in outcomes)
        spent = sum(o.forward_s for o in outcomes)
        self.curve.observe(rows, spent, views=self.runner.views and any(p.branches for p in plans))
        self.last = StepReport(batch, rows, sum(len(it.draft.tree) + _aux_rows(it.draft) for it in items), spent)
        # 5. Absorb; retire the finished.
        events: list[tuple[Request, StepEvent]] = []
        for request, outcome in zip(list(self.active), outcomes):
            event = request.absorb(outcome, batch)
            if event is not None:
                events.append((request, event))
            if request.finished:
                events.append((request, request.result(self.runner.model.floor)))
                self.remove(request)
        return events


def _aux_rows(draft: Draft) -> int:
    return 0 if draft.aux is None else int(draft.aux.tokens.shape[0])


def device_costs(loaded: LoadedModel, runner: StepRunner, remeasure: bool = False) -> CostCurve:
    """The cost curve of `runner`'s passes on this device (engine/costs.py), cached per model, dtype,
    device and pass kind; `remeasure` re-times it and overwrites the cache (`lookahead profile`)."""
    return cost_curve(loaded.model, runner.model, cache_root() / "cost-curves.json", loaded.timing_key,
                      remeasure=remeasure)
