"""The calibrator (engine/calibration.py): counterfactual scoring, per-depth estimates, convergence."""

from __future__ import annotations

import random

import pytest

from lookahead.engine.calibration import CalibrationConfig, Calibrator
from lookahead.engine.sources import Candidate


def test_a_guess_is_scored_against_the_tokens_later_generated_at_its_positions() -> None:
    cal = Calibrator(CalibrationConfig(prior_hit=1, prior_miss=1, decay=1.0))
    tracker = cal.tracker()
    tracker.offer([Candidate((5, 6, 7), "s", 0)])
    tracker.record([5])  # token 1 right; tokens 2 and 3 not generated yet: pending
    assert cal.reached == {}
    tracker.record([6, 9])  # token 2 right, token 3 wrong: depth 1 hit, depth 2 hit, depth 3 miss
    assert cal.reached == {("s", 0, 1): 1, ("s", 0, 2): 1, ("s", 0, 3): 1}
    assert cal.hits == {("s", 0, 1): 1, ("s", 0, 2): 1, ("s", 0, 3): 0}
    # Laplace (1, 1): depth 1 (1 + 1) / (1 + 2), depth 3 (0 + 1) / (1 + 2)
    assert cal.path_probabilities(Candidate((1, 1, 1), "s", 0)) == pytest.approx([2 / 3, 4 / 9, 4 / 27])


def test_a_miss_settles_a_guess_before_its_last_position_is_generated() -> None:
    cal = Calibrator(CalibrationConfig(decay=1.0))
    tracker = cal.tracker()
    tracker.offer([Candidate((5, 6, 7), "s", 2)])
    tracker.record([4])  # wrong at depth 1: depths 2 and 3 were never put to the test
    assert cal.reached == {("s", 2, 1): 1}
    assert cal.hits == {("s", 2, 1): 0}


def test_features_and_sources_are_calibrated_apart() -> None:
    cal = Calibrator(CalibrationConfig(decay=1.0))
    tracker = cal.tracker()
    for _ in range(20):
        tracker.offer([Candidate((1,), "a", 0), Candidate((2,), "a", 1), Candidate((1,), "b", 0)])
        tracker.record([1])
    assert cal.conditional("a", 0, 1) > 0.9 > 0.1 > cal.conditional("a", 1, 1)
    assert cal.conditional("b", 0, 1) == cal.conditional("a", 0, 1)
    assert cal.conditional("c", 0, 1) == pytest.approx(1 / 3)  # no evidence: the prior
    assert set(cal.report()) == {"a/0/1", "a/1/1", "b/0/1"}


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.85])
def test_calibration_converges_on_a_source_of_known_acceptance(rate: float) -> None:
    # A synthetic source whose every token is right with probability `rate` (independently); depth d of
    # its guesses is reached with probability rate^(d-1). The estimates converge to `rate` at every
    # depth that sees enough trials, and the path probability to rate^d.
    rng = random.Random(7)
    cal = Calibrator(CalibrationConfig(decay=0.999))
    tracker = cal.tracker()
    for _ in range(6000):
        truth = [rng.randrange(1000) for _ in range(3)]
        guess = tuple(t if rng.random() < rate else -1 for t in truth)
        tracker.offer([Candidate(guess, "syn", 0)])
        tracker.record(truth)
    assert cal.conditional("syn", 0, 1) == pytest.approx(rate, abs=0.03)
    if rate >= 0.5:
        assert cal.conditional("syn", 0, 3) == pytest.approx(rate, abs=0.05)
        assert cal.path_probabilities(Candidate((0, 0, 0), "syn", 0))[-1] == pytest.approx(rate**3, abs=0.05)


def test_a_shared_calibrator_learns_from_every_request_of_its_class() -> None:
    cal = Calibrator(CalibrationConfig(decay=1.0))
    one, two = cal.tracker(), cal.tracker()
    one.offer([Candidate((3,), "s", 0)])
    two.offer([Candidate((4,), "s", 0)])
    one.record([3])  # each request scores its own guesses against its own text
    two.record([3])
    assert cal.reached[("s", 0, 1)] == 2 and cal.hits[("s", 0, 1)] == 1
