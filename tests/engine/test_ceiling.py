"""The width probe's ceiling: the widest pass whose rows agree with the floor's, and the engine keeping
every exact pass (steps, batches, drafts verified as proposed) within it."""

from __future__ import annotations

import pytest
import torch

import lookahead
from lookahead import LookaheadConfig
from lookahead.engine.model_runner import ModelRunner
from lookahead.engine.numerics import floor_and_ceiling, probe_width_floor, row_rule
from lookahead.errors import ConfigError
from lookahead.testing import tiny_model

from .helpers import WidthDependent, model64, prompts


def _planted_ceiling(above: int) -> tuple[lookahead.LoadedModel, _WidthDependent]:
    """A kernel that takes another path in passes of more than `above` rows, all sequences together (as
    oneDNN's bfloat16 linears did from 33 rows on a Xeon with AMX)."""
    lm = tiny_model("llama", dtype=torch.float64, seed=2)
    planted = WidthDependent(1, 1e-3, total=True, above=above)
    lm.model.model.norm.register_forward_hook(planted.hook)
    return lm, planted


def test_floor_and_ceiling_from_row_fingerprints() -> None:
    # Hand-made fingerprints per probed width (one tensor per context, one entry per row). The floor is
    # the lowest width from which every width up to the ceiling agrees with the ceiling's rows; among
    # ceilings (at least min(MIN_CEILING, max_width) wide) the one with the lowest floor, then the widest.
    def ctx(*rows: list[int]) -> dict[int, torch.Tensor]:
        return {len(r): torch.tensor(r) for r in rows}

    # every width agrees: floor 1, ceiling the widest probed
    assert floor_and_ceiling([ctx([7], [7, 8], [7, 8, 9], [7, 8, 9, 5])], 4) == (1, 4)
    # width 1 computes its row otherwise (a one-row kernel): floor 2
    assert floor_and_ceiling([ctx([6], [7, 8], [7, 8, 9], [7, 8, 9, 5])], 4) == (2, 4)
    # widths 3-4 take another path (row 1 changes there): floor 1 holds up to 2, and 3-4 agree only from
    # 3, so the lowest floor wins with the narrower ceiling where a ceiling of 2 is wide enough ...
    assert floor_and_ceiling([ctx([7], [7, 8], [7, 4, 9], [7, 4, 9, 5])], 2) == (1, 2)
    # ... and where ceilings must be at least 4 wide, floor 3
    assert floor_and_ceiling([ctx([7], [7, 8], [7, 4, 9], [7, 4, 9, 5])], 4) == (3, 4)
    # a second context where width 2 differs raises the floor for every ceiling
    assert floor_and_ceiling([ctx([7], [7, 8], [7, 8, 9], [7, 8, 9, 5]),
                              ctx([1], [2, 2], [1, 2, 3], [1, 2, 3, 4])], 4) == (3, 4)
    # no width agrees with a wider one: no floor (a width compared only with itself proves nothing)
    assert floor_and_ceiling([ctx([1], [2, 2], [3, 3, 3], [4, 4, 4, 4])], 4) == (None, None)
    # widths agree only from 18 on: a floor above USABLE_FLOOR (16) is none
    assert floor_and_ceiling([ctx(*[[w] * w for w in range(1, 18)], *[[0] * w for w in (18, 19, 20)])], 16) \
        == (None, None)


def test_row_rule_pads_to_the_quantum_that_gives_the_lowest_floor() -> None:
    # A pass's last w % 2 rows take another kernel (-1 here; a full pair's rows are 0, 1, ...), as MKL's
    # float64 matmuls did with w % 4 on Zen 4. Every row compared, widths 1-8: under quantum 1 an even
    # width agrees only with the odd width after it (4 with 5: floor 4, ceiling 5); counting only even
    # widths, 2, 4, 6 and 8 all agree: floor 2, ceiling 8, passes padded to even widths. The lower floor wins.
    prints = [{w: torch.tensor(list(range(w - w % 2)) + [-1] * (w % 2)) for w in range(1, 9)}]
    assert floor_and_ceiling(prints, 4) == (4, 5)
    assert floor_and_ceiling(prints, 4, quantum=2) == (2, 8)
    assert row_rule(prints, 4) == (2, 8, 2)
    # rows that agree at every width: quantum 1 (the smallest of equals)
    assert row_rule([{w: torch.arange(w) for w in range(1, 9)}], 4) == (1, 8, 1)
    # no quantum gives a usable floor
    assert row_rule([{w: torch.full((w,), w) for w in range(1, 9)}], 4) == (None, None, 1)


def test_probe_finds_a_planted_ceiling_and_steps_stay_under_it() -> None:
    # Rows change in passes of more than 20 rows: widths 24, 31, 32 agree among themselves but only from
    # 24 on (a floor too high to use), so the probe takes the model's own floor (<= 4, see above) with
    # ceiling 17 (the widest probed width <= 20; 16 where passes run at multiples of 4), and the engine
    # never runs an exact pass wider, even for drafts verified as proposed.
    lm, planted = _planted_ceiling(20)
    probe = probe_width_floor(lm.model, max_width=32)
    assert probe.floor is not None and probe.floor <= 4, probe
    assert probe.ceiling == probe.widest_exact and probe.ceiling in (16, 17) and probe.ceiling % probe.quantum == 0
    assert all(probe.diffs[w] == 0 for w in probe.diffs if w <= 17) and probe.diffs[24] > 0
    wide = LookaheadConfig(4, 4, 4)
    assert wide.query_tokens > 17  # steps would go wider than the ceiling if let
    accepted = 0
    for i, text in enumerate(prompts(6)):
        ids = lm.encode(text, raw=True)[:12]  # prompts shorter than the ceiling: the prefill is a pass too
        ar = lookahead.generate(lm, ids, max_new_tokens=24, strategy="autoregressive")
        planted.widest = 0
        la = lookahead.generate(lm, ids, max_new_tokens=24, lookahead=wide, adaptive=i % 2 == 0)
        assert la.token_ids == ar.token_ids, f"prompt {i}"
        assert la.width_floor == probe.floor and probe.floor < planted.widest <= probe.ceiling, planted.widest
        accepted += la.stats.guesses_accepted
    assert accepted > 0, "no guess was accepted: the test would prove nothing"


def test_batched_passes_share_the_ceiling() -> None:
    # A batch of B requests gets ceiling // B rows each (a pass is rectangular); a batch that cannot fit
    # its requests' floor rows under the ceiling is refused with what to do.
    from lookahead.config import GenerationConfig
    from lookahead.scheduler.request import Request
    from lookahead.scheduler.scheduler import Scheduler, SchedulerConfig

    from ..scheduler.helpers import drain

    lm, planted = _planted_ceiling(20)
    texts = [t for t in prompts(4)]
    ids = [lm.encode(t, raw=True)[:8] for t in texts]
    alone = [lookahead.generate(lm, x, max_new_tokens=16).token_ids for x in ids]
    scheduler = Scheduler(lm, SchedulerConfig(max_batch=4))
    assert scheduler.runner.model.ceiling is not None and scheduler.runner.model.ceiling <= 20
    planted.widest = 0
    requests = [Request(lm, x, GenerationConfig(max_new_tokens=16)) for x in ids]
    for r in requests:
        scheduler.add(r)
    done = drain(scheduler)
    assert [done[id(r)] for r in requests] == alone
    assert planted.widest <= scheduler.runner.model.ceiling
    with pytest.raises(ConfigError, match="widest exact pass"):
        Scheduler(lm, SchedulerConfig(max_batch=scheduler.runner.model.ceiling + 1))


def test_a_pass_wider_than_the_ceiling_is_refused_and_padding_stops_there() -> None:
    runner = ModelRunner(model64("llama").model, floor=1, ceiling=12)
    assert runner.pass_width(1, 5) == 5
    assert runner.pass_width(2, 3, width=10) == 6  # padding toward a cheaper width stops at 12 rows in all
    assert runner.pass_width(1, 12, width=16) == 12
    with pytest.raises(ValueError, match="widest exact pass"):
        runner.pass_width(2, 7)


def test_passes_run_at_multiples_of_the_quantum_within_the_ceiling() -> None:
    runner = ModelRunner(model64("llama").model, floor=4, ceiling=17, quantum=4)
    assert runner.pass_width(1, 2) == 4  # the floor
    assert runner.pass_width(1, 5) == 8  # 5 real rows: a pass of 8
    assert runner.room(1) == 16 and runner.room(2) == 8  # within 17 rows, in multiples of 4
    assert runner.pass_width(2, 3, width=10) == 8  # padding toward 12 stops at 8 a sequence (16 in all)
    with pytest.raises(ValueError, match="widest exact pass"):
        runner.pass_width(1, 17)  # a pass of 20 rows


def test_batch_timings_skip_batches_wider_than_the_ceiling() -> None:
    # the server's default batch size is timed over batches of one-row sequences: a batch of 16 or 32
    # would be a pass wider than a ceiling of 12, which the model runner refuses, so it is not timed
    from lookahead.engine.numerics import WidthProbe
    from lookahead.engine.step import StepRunner
    from lookahead.scheduler.batch_costs import measure_batches

    lm = model64("llama")
    probe = WidthProbe(floor=1, max_width=32, diffs={}, dtype="float64", ceiling=12)
    runner = StepRunner(lm.model, None, probe)
    assert runner.model.ceiling == 12
    seconds = measure_batches(runner, lm.model.get_output_embeddings().weight.shape[0], batches=(1, 4, 8, 16, 32),
                              repeats=1, context=16)
    assert sorted(seconds) == [1, 4, 8]
