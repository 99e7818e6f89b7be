"""Timing the cost curve on a machine whose speed moves while it is being timed (engine/costs.measure).

A simulated device: a pass of k rows takes TRUE[k] time units times the machine's speed at that moment,
read from a simulated clock, so the test is exact and takes no real time.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch

from lookahead.engine.costs import DEFAULT_WIDTHS, measure

TRUE = {1: 1.0, 2: 1.0, 3: 1.05, 4: 1.1, 6: 1.15, 8: 1.2, 12: 1.3, 16: 1.4, 24: 1.7, 32: 2.0}
MODEL = SimpleNamespace(get_output_embeddings=lambda: SimpleNamespace(weight=torch.zeros(100, 4)))


class Device:
    """A runner whose passes advance `now` by their cost times `slowdown(pass number)`."""

    floor = None
    views = False

    def __init__(self, slowdown: Callable[[int], float]) -> None:
        self.slowdown = slowdown
        self.now = 0.0
        self.passes = 0

    def clock(self) -> float:
        return self.now

    def prefill(self, cache: object, tokens: list[int]) -> None:
        pass

    def forward_batch(self, cache: object, rows: list[SimpleNamespace]) -> None:
        self.now += TRUE[int(rows[0].tokens.shape[0])] * self.slowdown(self.passes)
        self.passes += 1


@pytest.mark.parametrize("slowdown", [
    lambda n: 1 + n / 20,  # the machine slows steadily, to 5x by the end
    lambda n: 2.0 if (n // 13) % 2 else 1.0,  # a neighbour comes and goes, halving the speed, mid-round
], ids=["ramp", "neighbour"])
def test_the_curve_survives_a_machine_that_changes_speed(slowdown: Callable[[int], float]) -> None:
    # Widths timed in one fixed order with each width's median taken alone come out skewed by whatever
    # the speed did meanwhile (up to 2x here); each round scaled by its own mean, in alternating order,
    # recovers every ratio to within a few percent.
    device = Device(slowdown)
    seconds = measure(MODEL, device, clock=device.clock)
    assert set(seconds) == set(DEFAULT_WIDTHS)
    for k, truth in TRUE.items():
        assert seconds[k] / seconds[1] == pytest.approx(truth, rel=0.08), k


def test_a_steady_machine_gives_the_exact_curve_in_seconds() -> None:
    device = Device(lambda n: 0.5)
    seconds = measure(MODEL, device, clock=device.clock)
    assert seconds == pytest.approx({k: 0.5 * v for k, v in TRUE.items()})
