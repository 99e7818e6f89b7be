"""Continuous batching: a request's tokens do not depend on its batch companions.

Each case decodes a mix of requests (strategies, greedy and seeded sampling, prompt lengths, token
limits) through one Scheduler with requests arriving at random steps, and compares every request's
tokens with decoding it alone (lookahead.generate). Float64 tiny models, so "equal" means bit-equal
logits up to argmax ties, which random weights do not produce.
"""

from __future__ import annotations

import random

import pytest
import torch

import lookahead
from lookahead.config import GenerationConfig, LookaheadConfig, SamplingConfig
from lookahead.engine.costs import CostCurve
from lookahead.engine.numerics import width_probe
from lookahead.engine.step import StepRunner
from lookahead.errors import ConfigError
from lookahead.scheduler.request import Request
import lookahead.scheduler.scheduler as sched_module
from lookahead.scheduler.scheduler import Scheduler, SchedulerConfig
from lookahead.testing import ARCHS, tiny_model

from ..engine.helpers import model64, prompts
from .helpers import drain, run_batched

GREEDY = SamplingConfig()


def mix(n: int, seed: int) -> list[tuple[str, GenerationConfig]]:
    """n requests: prompts of different lengths, strategies, greedy or seeded sampling, token limits."""
    rng = random.Random(seed)
    out = []
    for i, text in enumerate(prompts(n)):
        sampling = GREEDY if i % 2 == 0 else SamplingConfig(temperature=0.8, top_p=0.9, seed=100 + i)
        strategy = ("lookahead", "prompt_lookup", "autoregressive", "lookahead")[i % 4]
        cfg = GenerationConfig(max_new_tokens=rng.randint(6, 20), strategy=strategy, sampling=sampling,
                               lookahead=LookaheadConfig(sources=("context", "suffix", "recycle", "jacobi")))
        out.append((text, cfg))
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_batched_tokens_equal_each_request_decoded_alone(arch: str) -> None:
    lm = model64(arch)
    requests = mix(7, seed=1)
    alone = {i: lookahead.generate(lm, lm.encode(text, raw=True), max_new_tokens=cfg.max_new_tokens,
                                   strategy=cfg.strategy, sampling=cfg.sampling, lookahead=cfg.lookahead).token_ids
             for i, (text, cfg) in enumerate(requests)}
    # as many requests as share an exact pass on this device (the float64 gpt2 here: floor 8, ceiling 16 on Zen 4)
    runner = StepRunner(lm.model, None, width_probe(lm.model)).model
    fits = max(b for b in range(1, 8) if runner.fits(b))
    assert fits >= 2, "no two requests fit one pass: the test would prove nothing"
    for max_batch, seed in ((min(3, fits), 0), (min(7, fits), 1)):
        batched, widest = run_batched(lm, [(lm.encode(t, raw=True), c) for t, c in requests], max_batch, seed)
        assert widest > 1, "the requests never shared a pass: the test would prove nothing"
        for i in alone:
            assert batched[i] == alone[i], f"{arch} request {i} ({requests[i][1].strategy}) batch {max_batch}"


def test_a_cancelled_request_frees_its_slot_and_changes_no_one_else() -> None:
    lm = model64("llama")
    requests = mix(4, seed=2)
    alone = [lookahead.generate(lm, lm.encode(t, raw=True), max_new_tokens=c.max_new_tokens, strategy=c.strategy,
                                sampling=c.sampling, lookahead=c.lookahead).token_ids for t, c in requests]
    scheduler = Scheduler(lm, SchedulerConfig(max_batch=3))
    live = [Request(lm, lm.encode(t, raw=True), c) for t, c in requests[:3]]
    for r in live:
        scheduler.add(r)
    scheduler.step()
    scheduler.remove(live[0])  # slot 0 is freed: the request in the last slot moves into it
    assert scheduler.free_slots == 1 and live[0] not in scheduler.active
    late = Request(lm, lm.encode(requests[3][0], raw=True), requests[3][1])
    scheduler.add(late)
    done = drain(scheduler)
    assert done[id(live[1])] == alone[1] and done[id(live[2])] == alone[2] and done[id(late)] == alone[3]


def test_a_full_batch_refuses_another_request() -> None:
    lm = model64("llama")
    scheduler = Scheduler(lm, SchedulerConfig(max_batch=1))
    cfg = GenerationConfig(max_new_tokens=4)
    scheduler.add(Request(lm, lm.encode("abc", raw=True), cfg))
    with pytest.raises(RuntimeError, match="batch is full"):
        scheduler.add(Request(lm, lm.encode("abd", raw=True), cfg))


@pytest.mark.parametrize("bad", [dict(max_batch=0), dict(max_batch=4, max_rows=3), dict(widest=0),
                                 dict(max_batch="2")])
def test_bad_scheduler_settings_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        SchedulerConfig(**bad)  # type: ignore[arg-type]


def test_a_request_wider_than_the_probe_widens_it() -> None:
    # The scheduler's probe covered 64-row steps; a request whose steps reach 87 rows (1 + 16*4 + 2*11)
    # makes it probe those widths too (the exactness of wider passes is then measured, not assumed), and
    # decodes as alone.
    lm = tiny_model("qwen2", dtype=torch.float64, seed=5)  # its own model: no other test probed it wider
    scheduler = Scheduler(lm, SchedulerConfig(max_batch=2, widest=8))
    assert scheduler.probe_width == 64
    cfg = GenerationConfig(max_new_tokens=12, lookahead=LookaheadConfig(window=16, ngram=5, guesses=2))
    assert cfg.widest_step == 87
    ids = lm.encode("abcabcabcabc", raw=True)
    request = Request(lm, ids, cfg)
    scheduler.add(request)
    assert scheduler.probe_width >= 87
    from .helpers import drain

    assert drain(scheduler)[id(request)] == lookahead.generate(lm, ids, max_new_tokens=12,
                                                               lookahead=cfg.lookahead).token_ids


@pytest.mark.parametrize("exact, capped", [(True, False), (True, True), (False, False)])
def test_exact_passes_are_padded_to_a_cheaper_width(exact: bool, capped: bool) -> None:
    # A device where 2 and 3 times the floor's rows cost less than one row (SmolLM2 bf16 on Zen 4: 3 rows
    # cost 0.88 of one). An exact pass computes each row alike at any width from the floor on, so even an
    # autoregressive step runs at the cheapest width, 3x the floor (2x within max_rows = 2x the floor), with
    # the same tokens; an unpadded pass, whose rows may change with the width, stays one row wide.
    lm = model64("llama")
    ids = lm.encode("abcab", raw=True)
    runner = StepRunner(lm.model, None, width_probe(lm.model)).model
    f = runner.floor or 4  # the tiny llama in float64: floor 4 on the Zen 4 this was written on
    max_rows = 2 * f if capped else None
    cfg = GenerationConfig(max_new_tokens=6, strategy="autoregressive", exact=exact)
    scheduler = Scheduler(lm, SchedulerConfig(max_batch=1, max_rows=max_rows, exact=exact))
    scheduler.curve = CostCurve({1: 1.0, f: 1.0, 2 * f: 0.95, 3 * f: 0.9, 4 * f: 1.5}, scheduler.runner.model.floor,
                                learns=False)
    request = Request(lm, ids, cfg)
    scheduler.add(request)
    widths = []
    while scheduler.active:
        for _, event in scheduler.step():
            if event.result is not None:
                tokens = event.result.token_ids
        widths.append(scheduler.last.rows)
    if exact:  # as wide as the exact pass may go (the probe's ceiling, if any, clamps it)
        expected = runner.pass_width(1, 1, 2 * f if capped else 3 * f)
        assert expected > f, "the pass could not go past the floor: the test would prove nothing"
    else:
        expected = 1
    assert widths == [expected] * len(widths)
    assert tokens == lookahead.generate(lm, ids, max_new_tokens=6, strategy="autoregressive", exact=exact).token_ids


def test_the_allocator_prices_widths_as_they_will_run(monkeypatch: pytest.MonkeyPatch) -> None:
    # A curve whose cheapest width (8x the floor, 0.5) lies beyond max_rows (2x the floor): the pass can
    # never be padded that far, so a width just past the floor runs as itself (1 + 4/f interpolated between
    # f and 2f, which costs 5) and must be priced so, not at the unreachable 0.5. Priced without the limit,
    # every width up to 2f looked cheaper than one row, and steps speculated at a loss.
    lm = model64("llama")
    ids = lm.encode("abcabcabcab", raw=True)
    f = StepRunner(lm.model, None, width_probe(lm.model)).model.floor or 4
    max_rows = 2 * f
    scheduler = Scheduler(lm, SchedulerConfig(max_batch=1, max_rows=max_rows, exact=True))
    ceiling = scheduler.runner.model.ceiling  # the widest exact pass caps max_rows too
    limit = max_rows if ceiling is None else min(max_rows, ceiling)
    assert limit > f, "no width past the floor fits: the test would prove nothing"
    curve = CostCurve({1: 1.0, f: 1.0, 2 * f: 5.0, 8 * f: 0.5}, scheduler.runner.model.floor, learns=False)
    scheduler.curve = curve
    seen: list[list[float]] = []
    real = sched_module.allocate_batch

    def spy(requests, cost, **kwargs):  # type: ignore[no-untyped-def]
        seen.append([cost(k) for k in range(1, limit + 1)])
        return real(requests, cost, **kwargs)

    monkeypatch.setattr(sched_module, "allocate_batch", spy)
    cfg = GenerationConfig(max_new_tokens=6, strategy="prompt_lookup")
    scheduler.add(Request(lm, ids, cfg))
    drain(scheduler)
    assert seen, "the scheduler never allocated"
    expected = [curve(k, limit) for k in range(1, limit + 1)]
    assert expected[f] == pytest.approx(1.0 + 4.0 / f) and curve(f + 1) == 0.5  # the limit changes the price
    assert all(prices == expected for prices in seen)
