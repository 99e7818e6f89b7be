"""The calibrator (engine/calibration.py): counterfactual scoring, per-depth estimates, convergence."""

from __future__ import annotations

import gc
import random
import weakref

import pytest
import torch

import lookahead
from lookahead import SamplingConfig
from lookahead.engine.calibration import CalibrationConfig, Calibrator, shared_calibrator
from lookahead.candidates.recycling import SuccessorTable
from lookahead.engine.shared import reset_shared, shared
from lookahead.engine.sources import Candidate
from lookahead.errors import ConfigError
from lookahead.testing import tiny_model


def test_a_guess_is_scored_against_the_tokens_later_generated_at_its_positions() -> None:
    cal = Calibrator(CalibrationConfig(prior_hit=1, prior_miss=1, decay=1.0, depth_backoff=False))
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
    # 20/20 right vs 0/20 right; each is shrunk (3 pseudo-counts) towards the other feature's smoothed rate
    assert cal.conditional("a", 0, 1) == pytest.approx((20 + 3 * (0 + 1) / (20 + 3)) / (20 + 3))  # 0.875
    assert cal.conditional("a", 1, 1) == pytest.approx((0 + 3 * (20 + 1) / (20 + 3)) / (20 + 3))  # 0.119
    # b's only feature backs off to the fixed prior (1, 2): (20 + 1) / (20 + 3); a's evidence plays no part
    assert cal.conditional("b", 0, 1) == pytest.approx(21 / 23)
    assert cal.conditional("c", 0, 1) == pytest.approx(1 / 3)  # no evidence: the prior
    assert set(cal.report()) == {"a/0/1", "a/1/1", "b/0/1"}
    assert cal.report()["b/0/1"]["rate"] == pytest.approx(21 / 23, abs=1e-4)


def test_a_steps_guesses_are_rated_as_each_alone_whatever_they_share() -> None:
    # conditionals_of computes each (source, feature) once, to its longest guess: every guess must still
    # get exactly what conditionals() gives it alone (a shorter one a prefix of a longer one's rates).
    cal = Calibrator(CalibrationConfig(decay=0.9))
    tracker = cal.tracker()
    rng = random.Random(3)
    for _ in range(60):  # uneven evidence over sources, features and depths
        tracker.offer([Candidate(tuple(rng.randrange(3) for _ in range(rng.randint(1, 5))), rng.choice("ab"),
                                 rng.randrange(3)) for _ in range(4)])
        tracker.record([rng.randrange(3) for _ in range(rng.randint(1, 3))])
    guesses = [Candidate((1, 2, 3, 4, 5), "a", 0), Candidate((1,), "a", 0), Candidate((2, 2), "b", 1),
               Candidate((1, 2, 3), "a", 0), Candidate((7, 7, 7, 7), "c", 2), Candidate((4, 4), "a", 1)]
    assert cal.conditionals_of(guesses) == [cal.conditionals(g) for g in guesses]
    assert cal.conditionals_of([]) == []


def test_an_unseen_feature_starts_from_its_sources_measured_rate() -> None:
    # Source "r" has been right 2 times in 40 with feature 0 at depth 1 and never tried feature 7. With
    # backoff, feature 7 starts from what feature 0 showed, smoothed by the prior (1, 2):
    # m = (2 + 1) / (40 + 3) = 3/43, far below the fixed prior 1/3 that plain Laplace smoothing gives.
    for backoff, expected in [(True, 3 / 43), (False, 1 / 3)]:
        cal = Calibrator(CalibrationConfig(decay=1.0, backoff=backoff))
        tracker = cal.tracker()
        for i in range(40):
            tracker.offer([Candidate((1,), "r", 0)])
            tracker.record([1 if i < 2 else 2])
        assert cal.conditional("r", 7, 1) == pytest.approx(expected)
        assert cal.conditional("r", 7, 2) == pytest.approx(1 / 3)  # depth 2 never reached: the fixed prior
        assert cal.conditional("other", 7, 1) == pytest.approx(1 / 3)  # another source: the fixed prior
    # A feature with its own evidence leans on it: 10 hits in 10 tries against the source's 2 in 40
    cal = Calibrator(CalibrationConfig(decay=1.0))
    tracker = cal.tracker()
    for i in range(40):
        tracker.offer([Candidate((1,), "r", 0)])
        tracker.record([1 if i < 2 else 2])
    for _ in range(10):
        tracker.offer([Candidate((5,), "r", 3)])
        tracker.record([5])
    assert cal.conditional("r", 3, 1) == pytest.approx((10 + 3 * 3 / 43) / 13)
    # and feature 0's backoff now counts feature 3's record: m = (10 + 1) / (10 + 3)
    assert cal.conditional("r", 0, 1) == pytest.approx((2 + 3 * 11 / 13) / 43)


def test_a_rarely_reached_depth_starts_from_the_rate_above_it() -> None:
    # Source "s" was right at depth 1 in 18 of 20 guesses, and its depth 2 was put to the test twice
    # (both right). Depth 1: (18 + 1) / (20 + 3) = 19/23. With depth backoff depth 2's prior is raised from
    # the fixed 1/3 to depth 1's estimate, so depth 2 = (2 + 3 * 19/23) / (2 + 3) = 103/115 (0.90) instead
    # of (2 + 1) / 5 = 0.6; depth 3, never reached, starts from depth 2's estimate (0.90), not from 1/3.
    for depth_backoff in (True, False):
        cal = Calibrator(CalibrationConfig(decay=1.0, depth_backoff=depth_backoff))
        tracker = cal.tracker()
        for i in range(20):
            tracker.offer([Candidate((1, 2) if i < 2 else (1,), "s", 0)])
            tracker.record([1, 2] if i < 2 else [1 if i < 18 else 9])
        assert cal.conditional("s", 0, 1) == pytest.approx(19 / 23)
        if depth_backoff:
            assert cal.conditional("s", 0, 2) == pytest.approx(103 / 115)
            assert cal.conditional("s", 0, 3) == pytest.approx(103 / 115)  # no evidence at depth 3
            assert cal.path_probabilities(Candidate((1, 2, 3), "s", 0)) == pytest.approx(
                [19 / 23, 19 / 23 * 103 / 115, 19 / 23 * (103 / 115) ** 2])
        else:
            assert cal.conditional("s", 0, 2) == pytest.approx(3 / 5)
            assert cal.conditional("s", 0, 3) == pytest.approx(1 / 3)


def test_depth_backoff_never_lowers_the_prior_and_yields_to_evidence() -> None:
    # A source right at depth 1 in 1 of 30: depth 1 = (1 + 1) / 33. Depth 2 never reached keeps the fixed
    # prior 1/3 (the prior is raised to the depth above, never lowered to it).
    cal = Calibrator(CalibrationConfig(decay=1.0))
    tracker = cal.tracker()
    for i in range(30):
        tracker.offer([Candidate((1,), "s", 0)])
        tracker.record([1 if i == 0 else 2])
    assert cal.conditional("s", 0, 1) == pytest.approx(2 / 33)
    assert cal.conditional("s", 0, 2) == pytest.approx(1 / 3)
    # A source always right at depth 1 (40 of 40) but wrong at depth 2 in 40 of 40: depth 2 follows its
    # own evidence, (0 + 3 * 41/43) / 43, whatever depth 1 says.
    cal = Calibrator(CalibrationConfig(decay=1.0))
    tracker = cal.tracker()
    for _ in range(40):
        tracker.offer([Candidate((1, 2), "s", 0)])
        tracker.record([1, 5])
    assert cal.conditional("s", 0, 1) == pytest.approx(41 / 43)
    assert cal.conditional("s", 0, 2) == pytest.approx(3 * 41 / 43 / 43)
    assert cal.conditional("s", 0, 2) < 0.07


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


@pytest.mark.parametrize("kwargs", [{"prior_hit": 0}, {"prior_miss": -1}, {"decay": 0.0}, {"decay": 1.5},
                                    {"backoff": "yes"}, {"siblings": 1}, {"depth_backoff": None},
                                    {"agreement": "no"}, {"confidence": 1}, {"confidence_decay": 0.0},
                                    {"confidence_decay": 1.5}])
def test_bad_calibration_settings_are_refused_with_the_value(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="must be"):
        CalibrationConfig(**kwargs)


def test_requests_on_one_model_share_a_calibrator_per_strategy_and_mode() -> None:
    # generate() without a calibrator uses the process's shared one for (model, strategy, greedy/sampled):
    # the second request starts from what the first taught it, not from the 1/3 prior at every depth.
    lm = tiny_model("llama", dtype=torch.float64, seed=11)
    ids = lm.encode("abcabcabcabcabc", raw=True)
    shared = shared_calibrator(lm.model, "lookahead/greedy")
    assert not shared.reached
    first = lookahead.generate(lm, ids, max_new_tokens=12, strategy="lookahead")
    after_first = dict(shared.reached)
    assert after_first  # the first request's guesses were scored into the shared estimates
    second = lookahead.generate(lm, ids, max_new_tokens=12, strategy="lookahead")
    assert second.token_ids == first.token_ids  # the calibrator sizes steps, never changes tokens
    assert shared.reached != after_first  # ... and the second request's were scored into the same one
    # an explicit calibrator learns alone; another strategy or sampled text has its own shared one
    own = Calibrator()
    before = dict(shared.reached)
    lookahead.generate(lm, ids, max_new_tokens=12, strategy="lookahead", calibrator=own)
    assert own.reached and shared.reached == before
    lookahead.generate(lm, ids, max_new_tokens=12, strategy="prompt_lookup")
    lookahead.generate(lm, ids, max_new_tokens=12, strategy="lookahead", sampling=SamplingConfig(temperature=1.0, seed=1))
    assert shared.reached == before
    assert shared_calibrator(lm.model, "prompt_lookup/greedy").reached
    assert shared_calibrator(lm.model, "lookahead/sampled").reached


def test_requests_on_one_model_share_recycled_successors_like_their_calibrator() -> None:
    # The model's top-k successors recycled by one request are there for the next one's first steps
    # (token recycling's hot start); a request with its own calibrator learns them alone too, unless it
    # is handed a table.
    lm = tiny_model("llama", dtype=torch.float64, seed=11)
    ids = lm.encode("abcabcabcabcabc", raw=True)
    table = shared(lm.model, "successors", "lookahead/greedy", SuccessorTable)
    assert not len(table)
    first = lookahead.generate(lm, ids, max_new_tokens=12, strategy="lookahead")
    rows = dict(table.adj)
    assert rows  # the first request's rows went into the shared table
    other = lm.encode("cbacbacba", raw=True)
    assert lookahead.generate(lm, other, max_new_tokens=12, strategy="lookahead").token_ids == \
        lookahead.generate(lm, other, max_new_tokens=12, strategy="autoregressive").token_ids  # hot, still exact
    assert lookahead.generate(lm, ids, max_new_tokens=12, strategy="lookahead").token_ids == first.token_ids
    before = dict(table.adj)
    lookahead.generate(lm, [t + 1 for t in ids], max_new_tokens=12, strategy="lookahead", calibrator=Calibrator())
    assert table.adj == before  # learned alone
    mine = SuccessorTable()
    lookahead.generate(lm, ids, max_new_tokens=12, strategy="lookahead", calibrator=Calibrator(), successors=mine)
    assert len(mine) and table.adj == before
    with pytest.raises(ConfigError, match="successors must be a lookahead.candidates.recycling.SuccessorTable"):
        lookahead.generate(lm, ids, max_new_tokens=4, strategy="lookahead", successors={})


def test_shared_objects_are_one_per_owner_kind_and_label() -> None:
    class Owner:
        pass

    a = Owner()
    assert shared(a, "k", "x", list) is shared(a, "k", "x", list)
    assert shared(a, "k", "x", list) is not shared(a, "other", "x", list)
    assert shared(a, "calibrator", "x", Calibrator) is shared_calibrator(a, "x")


def test_a_shared_calibrator_is_one_object_per_owner_and_label_and_goes_with_its_owner() -> None:
    class Owner:
        pass

    a, b = Owner(), Owner()
    assert shared_calibrator(a, "x") is shared_calibrator(a, "x")
    assert shared_calibrator(a, "x") is not shared_calibrator(a, "y")
    assert shared_calibrator(a, "x") is not shared_calibrator(b, "x")
    gone = weakref.ref(shared_calibrator(b, "x"))
    del b
    gc.collect()
    assert gone() is None  # dropped with the model it was learned on


def test_resetting_the_shared_calibrators_starts_every_model_from_the_prior() -> None:
    class Owner:
        pass

    owner = Owner()
    learned = shared_calibrator(owner, "x")
    learned.observe(Candidate((1,), "s", 0), 1, True)
    reset_shared()
    fresh = shared_calibrator(owner, "x")
    assert fresh is not learned and not fresh.reached


def test_a_calibrator_that_is_not_one_is_refused_with_what_to_pass() -> None:
    lm = tiny_model("llama", dtype=torch.float64, seed=11)
    with pytest.raises(ConfigError, match="calibrator must be a lookahead.engine.calibration.Calibrator"):
        lookahead.generate(lm, "abc", raw=True, max_new_tokens=2, calibrator={"context": 0.5})


def test_the_models_confidence_separates_tokens_one_source_rate_lumps_together() -> None:
    # One source, one feature: half its first tokens are ones the model was sure of (bucket 6), right 90%
    # of the time; the other half ones the model gave little (bucket 2), right 10%. The source's rate is
    # ~0.5 for both; the confidence factors learn ~0.9/0.5 and ~0.1/0.5 and pull the two apart.
    rng = random.Random(3)
    cal = Calibrator(CalibrationConfig(decay=0.999))
    tracker = cal.tracker()
    cand = Candidate((1,), "syn", 0)
    for i in range(4000):
        sure = i % 2 == 0
        truth = 1 if rng.random() < (0.9 if sure else 0.1) else 2
        tracker.offer([cand], [(cal.conditionals(cand), [6 if sure else 2])])
        tracker.record([truth])
    assert cal.conditional("syn", 0, 1) == pytest.approx(0.5, abs=0.05)
    assert cal.path_probabilities(cand, [6])[0] == pytest.approx(0.9, abs=0.05)
    assert cal.path_probabilities(cand, [2])[0] == pytest.approx(0.1, abs=0.05)
    assert cal.path_probabilities(cand, [4]) == cal.path_probabilities(cand)  # a bucket never seen: factor 1
    off = Calibrator(CalibrationConfig(confidence=False))  # switched off: buckets are ignored
    assert off.path_probabilities(cand, [6]) == off.path_probabilities(cand, [2]) == off.path_probabilities(cand)


def test_confidence_factors_keep_depth_one_apart_from_deeper_tokens_and_cap_rates_at_one() -> None:
    cal = Calibrator(CalibrationConfig(decay=1.0, confidence_decay=1.0))
    tracker = cal.tracker()
    for _ in range(50):  # depth 1 in bucket 5 always right at a predicted 0.5; depth 2 in bucket 5 always wrong
        tracker.offer([Candidate((1, 2), "s", 0)], [([0.5, 0.5], [5, 5])])
        tracker.record([1, 3])
    assert cal.confidence_factor("s", 1, 5) == pytest.approx((50 + 3) / (25 + 3))
    assert cal.confidence_factor("s", 2, 5) == pytest.approx(3 / (25 + 3))
    assert cal.confidence_factor("s", 7, 5) == cal.confidence_factor("s", 2, 5)  # depths 2+ share one factor
    rates = cal.path_probabilities(Candidate((1, 2), "s", 0), [5, 5], conditionals=[0.9, 0.9])
    assert rates[0] == 1.0  # 0.9 * 1.89, capped: a conditional is a probability
    assert rates[1] == pytest.approx(0.9 * 3 / 28)
