"""Hand-written cases for the copy sources: the suffix matcher (prompt lookup's "context" source), the
cross-request n-gram cache, and the pool that merges sources into one calibrated tree. Expected
candidates are spelled out."""

from __future__ import annotations

import gc
import json
import random
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from lookahead.candidates.ngram_cache import NGramCache, NGramCacheConfig, NGramCaches
from lookahead.candidates.context import CacheSource, ContextSource
from lookahead.candidates.lookahead import JacobiSource
from lookahead.candidates.pool import PoolConfig, SourcePool
from lookahead.candidates.recycling import RecyclingSource
from lookahead.config import GenerationConfig, LookaheadConfig, PromptLookupConfig, SamplingConfig
from lookahead.engine.calibration import CalibrationConfig, Calibrator
from lookahead.engine.draft import CandidateTree, StepOutcome
from lookahead.engine.sources import Candidate, Observation
from lookahead.errors import ConfigError


def lookup(context: list[int], **cfg: int) -> list[tuple[int, ...]]:
    """The candidates prompt lookup offers for `context` (all of it already seen), best first."""
    pl = PromptLookupConfig(**cfg)
    source = ContextSource(context, range(pl.min_ngram, pl.max_ngram + 1))
    return [c.tokens for c in source.candidates(context, pl.num_tokens, pl.max_candidates)]


def paths(tree: CandidateTree) -> list[tuple[int, ...]]:
    """Every root-to-leaf path of a candidate trie, leaves in insertion order."""
    paths = []
    for leaf in [i for i in range(len(tree)) if i not in set(tree.parents)]:
        path, j = [], leaf
        while j >= 0:
            path.append(tree.tokens[j])
            j = tree.parents[j]
        paths.append(tuple(reversed(path)))
    return paths


# --- suffix matcher ---------------------------------------------------------------------------------

def test_suffix_match_follows_the_earlier_occurrence() -> None:
    # context 1 2 3 4 1 2 3: the suffix (1 2 3) occurred at the start, followed by 4 1
    # (suffixes (2 3) and (3) point at the same place: no duplicate)
    assert lookup([1, 2, 3, 4, 1, 2, 3], num_tokens=2) == [(4, 1)]


def test_several_matches_most_recent_first() -> None:
    # context 5 6 7 5 6 8 5 6: (8 5 6) never occurred before; (5 6) occurred twice: followed by
    # 8 5 6 (the more recent, at index 5) and by 7 5 6 (index 2)
    assert lookup([5, 6, 7, 5, 6, 8, 5, 6], num_tokens=3) == [(8, 5, 6), (7, 5, 6)]
    # only one slot: the more recent one
    assert lookup([5, 6, 7, 5, 6, 8, 5, 6], num_tokens=3, max_candidates=1) == [(8, 5, 6)]


def test_longest_match_wins_over_a_more_recent_shorter_one() -> None:
    # context 9 1 2 7 1 2 8 9 1 2: (9 1 2) occurred at the start -> 7 1; (1 2) also occurred at
    # index 4 -> 8 9 (more recent but shorter); (9 1 2) goes first
    assert lookup([9, 1, 2, 7, 1, 2, 8, 9, 1, 2], num_tokens=2) == [(7, 1), (8, 9)]


def test_min_ngram_excludes_short_matches() -> None:
    # context 5 6 7 5 6 8 5 6 with suffixes of 3 only: (8 5 6) never occurred -> nothing to verify
    assert lookup([5, 6, 7, 5, 6, 8, 5, 6], min_ngram=3, max_ngram=3, num_tokens=3) == []
    # no token repeats at all -> nothing either
    assert lookup([1, 2, 3, 4, 5], num_tokens=3) == []


def test_candidates_stop_at_the_end_of_the_context_and_at_the_budget() -> None:
    # context 1 2 1: (1) was followed by 2 1 -- only two tokens exist after it
    assert lookup([1, 2, 1], num_tokens=5) == [(2, 1)]
    source = ContextSource([1, 2, 3, 1])
    assert [c.tokens for c in source.candidates([1, 2, 3, 1], 2, 4)] == [(2, 3)]
    assert source.candidates([1, 2, 3, 1], 0, 4) == []


def test_prompt_lookup_learns_accepted_tokens_and_buckets_by_key_length() -> None:
    source = ContextSource([4, 5], range(1, 4))
    assert source.candidates([4, 5], 2, 4) == []
    # the step accepted 4 5 6 4: now the context is 4 5 4 5 6 4; (4) was followed by 5 6 (at index 3)
    # and by 5 4 (index 1); both matched a 1-token key: features 4*1 + rank
    context = [4, 5, 4, 5, 6, 4]
    source.observe(Observation(context, [4, 5, 6, 4]))
    found = source.candidates(context, 2, 4)
    assert [(c.tokens, c.feature) for c in found] == [((5, 6), 4), ((5, 4), 5)]


@pytest.mark.parametrize("bad", [dict(min_ngram=0), dict(min_ngram=3, max_ngram=2), dict(num_tokens=0),
                                 dict(max_candidates=0), dict(num_tokens=200, max_candidates=3)])
def test_prompt_lookup_config_is_validated(bad: dict[str, int]) -> None:
    with pytest.raises(ConfigError, match="prompt lookup|num_tokens"):
        PromptLookupConfig(**bad)


# --- cross-request n-gram cache ---------------------------------------------------------------------

def test_cache_entries_and_lookup() -> None:
    cache = NGramCache(NGramCacheConfig(key_lengths=(2, 1), num_tokens=3))
    # prompt 1 2, response 3 4 5 3 6 -> sequence 1 2 | 3 4 5 3 6; each response position j gives
    # (key before j) -> (up to 3 tokens from j):
    #   (1 2)->(3 4 5) (2)->(3 4 5)   (2 3)->(4 5 3) (3)->(4 5 3)   (3 4)->(5 3 6) (4)->(5 3 6)
    #   (4 5)->(3 6)   (5)->(3 6)     (5 3)->(6)     (3)->(6)
    cache.add_response([1, 2], [3, 4, 5, 3, 6])
    assert len(cache) == 10
    # ... 5 3: key (5 3) -> (6); then key (3) -> (6) again (skipped) and (4 5 3)
    assert cache.lookup([9, 5, 3], length=3, limit=4) == [(6,), (4, 5, 3)]
    # ... 7 2: key (7 2) is unknown; key (2) -> (3 4 5), cut to 2 tokens
    assert cache.lookup([7, 2], length=2, limit=4) == [(3, 4)]
    assert cache.lookup([9, 5, 3], length=3, limit=1) == [(6,)]
    assert cache.lookup([8], length=3, limit=4) == []


def test_cache_evicts_least_recently_used() -> None:
    cache = NGramCache(NGramCacheConfig(max_entries=4, key_lengths=(1,), num_tokens=2))
    # response 1 2 3 4 5 6 -> (1)->(2 3) (2)->(3 4) (3)->(4 5) (4)->(5 6) (5)->(6): 5 entries, room
    # for 4: (1)->(2 3), the oldest, goes
    cache.add_response([], [1, 2, 3, 4, 5, 6])
    assert cache.lookup([1], 2, 4) == [] and cache.lookup([5], 2, 4) == [(6,)]
    # response 2 3 4: (2)->(3 4) is used again (now the most recent), (3)->(4) is new: the least
    # recently used, (3)->(4 5), goes
    cache.add_response([], [2, 3, 4])
    assert cache.lookup([3], 2, 4) == [(4,)]
    assert cache.lookup([2], 2, 4) == [(3, 4)]
    assert cache.lookup([4], 2, 4) == [(5, 6)]
    assert len(cache) == 4


def test_cache_keeps_the_most_recent_continuations_per_key() -> None:
    cache = NGramCache(NGramCacheConfig(key_lengths=(1,), num_tokens=1, max_per_key=2))
    # 7 1 7 2 7 3: key (7) was followed by 1, 2, 3; two are kept, most recent first
    cache.add_response([], [7, 1, 7, 2, 7, 3])
    assert cache.lookup([7], 1, 5) == [(3,), (2,)]


def test_cache_memory_is_bounded_and_reported() -> None:
    cfg = NGramCacheConfig(max_entries=2000)
    rng = random.Random(0)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        cache = NGramCache(cfg)
        for _ in range(60):  # 60 x 100 tokens x 3 key lengths = 18,000 entries offered
            cache.add_response([1, 2, 3], [rng.randrange(50_000) for _ in range(100)])
        gc.collect()
        first = tracemalloc.get_traced_memory()[0] - base
        for _ in range(60):
            cache.add_response([1, 2, 3], [rng.randrange(50_000) for _ in range(100)])
        gc.collect()
        second = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    mem = cache.memory()
    assert len(cache) == mem["entries"] == 2000
    assert second < first * 1.15  # full: twice the traffic, no more memory
    assert 0.75 * second < mem["bytes"] < 1.35 * second  # the reported figure is close to the measured one


def test_cache_save_and_load_round_trip(tmp_path: Path) -> None:
    cache = NGramCache(NGramCacheConfig(max_entries=3, key_lengths=(1,), num_tokens=2))
    cache.add_response([], [1, 2, 3, 4])  # (1)->(2 3) (2)->(3 4) (3)->(4)
    path = tmp_path / "cache.json"
    cache.save(path)
    loaded = NGramCache.load(path)
    assert loaded.config == cache.config and loaded.memory() == cache.memory()
    assert loaded.lookup([2], 2, 4) == [(3, 4)]
    # the LRU order survived: a new entry evicts (1)->(2 3), the oldest, in both
    for c in (cache, loaded):
        c.add_response([], [8, 9])
        assert c.lookup([1], 2, 4) == [] and c.lookup([8], 2, 4) == [(9,)]


@pytest.mark.parametrize("content", ["{not json", json.dumps({"version": 99}), json.dumps({"version": 1, "cache": {}}),
                                     json.dumps({"version": 1, "cache": {"key_lengths": [1], "num_tokens": 2,
                                                 "max_entries": 5, "max_per_key": 2, "entries": [[[1], []]]}})])
def test_bad_cache_file_is_refused_with_advice(tmp_path: Path, content: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match="delete|point to another"):
        NGramCache.load(path)
    with pytest.raises(ConfigError, match="no n-gram cache file"):
        NGramCache.load(tmp_path / "missing.json")


def test_per_class_caches_are_opt_in_and_saved_together(tmp_path: Path) -> None:
    caches = NGramCaches(["code", "json"], NGramCacheConfig(key_lengths=(1,), num_tokens=2))
    assert caches.get("chat") is None  # not opted in
    code = caches.get("code")
    assert code is not None
    code.add_response([], [1, 2, 3])
    assert caches.memory()["code"]["entries"] == 2 and caches.memory()["json"] == {"entries": 0, "bytes": 0}
    caches.save(tmp_path / "all.json")
    again = NGramCaches.load(tmp_path / "all.json")
    assert set(again.memory()) == {"code", "json"}
    assert again.get("code").lookup([1], 2, 4) == [(2, 3)]  # type: ignore[union-attr]


# --- the pool: every source's guesses, calibrated, in one tree ------------------------------------------

def pool(context: list[int], lk: LookaheadConfig, **extra: object) -> SourcePool:
    sources = [ContextSource(context), JacobiSource(lk.window, lk.ngram, context)]
    return SourcePool(sources, PoolConfig(max_tokens=lk.candidate_tokens, per_source=lk.guesses), Calibrator())


def test_context_candidates_take_context_tokens_jacobi_ones_stay_n_minus_1() -> None:
    # context 1 2 3 4 5 6 7 8 9 1 2 3: the suffix (1 2 3) occurred at the start, followed by 4 5 6 7 8 9.
    context = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]
    # N=4, context_tokens=None: a candidate is N-1 = 3 tokens, copied or minted
    assert paths(pool(context, LookaheadConfig(2, 4, 1, context_tokens=None)).propose(context, 100).tree) == [(4, 5, 6)]
    # the default copies up to 11 tokens: the span runs 4..9 and on into the repeat (1 2 3), where the
    # context ends, after 9
    assert paths(pool(context, LookaheadConfig(2, 4, 1)).propose(context, 100).tree) == [(4, 5, 6, 7, 8, 9, 1, 2, 3)]
    # context_tokens=7: cut at 7
    assert paths(pool(context, LookaheadConfig(2, 4, 1, context_tokens=7)).propose(context, 100).tree) == \
        [(4, 5, 6, 7, 8, 9, 1)]
    # context_tokens=5: the copied span runs on to 5 tokens ...
    longer = pool(context, LookaheadConfig(2, 4, 1, context_tokens=5))
    assert paths(longer.propose(context, 100).tree) == [(4, 5, 6, 7, 8)]
    # ... but never past the budget (tokens left to generate)
    assert paths(longer.propose(context, 2).tree) == [(4, 5)]
    # Jacobi n-grams keyed by the last token (3) are cut to N-1 tokens, even where the pool holds more;
    # with equal calibration (no evidence yet) the longer guess is worth more and goes first
    both = pool(context, LookaheadConfig(2, 4, 2, context_tokens=5))
    both.sources[1].pool.add(3, (7, 7, 7, 7, 7))  # type: ignore[attr-defined]
    assert paths(both.propose(context, 100).tree) == [(4, 5, 6, 7, 8), (7, 7, 7)]


def test_the_pool_puts_the_better_calibrated_guess_first() -> None:
    context = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]
    lk = LookaheadConfig(1, 3, 1, context_tokens=2)
    sources = [ContextSource(context), JacobiSource(lk.window, lk.ngram, context)]
    sources[1].pool.add(3, (7, 7))
    fresh = SourcePool(sources, PoolConfig(max_tokens=2, per_source=1), Calibrator())
    draft = fresh.propose(context, 100)
    assert paths(draft.tree) == [(4, 5), (7, 7)]  # no evidence: equal estimates, the context's first
    assert draft.tree.probs == pytest.approx([1 / 3, 1 / 9, 1 / 3, 1 / 9])  # Laplace prior 1 / (1 + 2)
    # Evidence: after such contexts the model went on with 7 7, so the jacobi guess (feature: rank 0)
    # was right twice each time and the context's 3-token match (feature 4*3 + rank 0) wrong at once.
    cal = Calibrator()
    tracker = cal.tracker()
    for _ in range(10):
        tracker.offer([Candidate((7, 7), "jacobi", 0), Candidate((4, 5), "context", 12)])
        tracker.record([7, 7])
    draft = SourcePool(sources, PoolConfig(max_tokens=2, per_source=1), cal).propose(context, 100)
    assert paths(draft.tree) == [(7, 7), (4, 5)]
    assert draft.tree.probs[0] > 0.8 and draft.tree.probs[2] < 0.2


def test_runner_up_first_tokens_are_discounted_by_what_the_model_did() -> None:
    # Two sources disagree on the token after 3: context says 4 (then 5), jacobi says 7 (then 7). With
    # no evidence both first tokens are worth 1/3 and nothing is corrected (factors start at 1).
    context = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]
    sources = [ContextSource(context), JacobiSource(1, 3, context)]
    sources[1].pool.add(3, (7, 7))  # type: ignore[attr-defined]
    cal = Calibrator()
    p = SourcePool(sources, PoolConfig(max_tokens=2, per_source=1), cal)
    draft = p.propose(context, 100)
    assert paths(draft.tree) == [(4, 5), (7, 7)]
    assert draft.tree.probs == pytest.approx([1 / 3, 1 / 9, 1 / 3, 1 / 9])
    # The model goes on with 4: the best first token (rank 0, predicted 1/3) was right, the runner-up
    # (rank 1, predicted 1/3) was not. The factor is (hits + 3) / (predicted + 3), 3 = the prior's weight.
    p.update(context, StepOutcome(accepted=[4], accepted_sources=["model"], aux_out=[], query_tokens=1,
                                  candidate_tokens=0))
    assert cal.sibling_factor(0) == pytest.approx((1 + 3) / (1 / 3 + 3))
    assert cal.sibling_factor(1) == pytest.approx((0 + 3) / (1 / 3 + 3))
    # The next step with the same two guesses (their per-source estimates have moved too: context was
    # right at depth 1, jacobi wrong): the runner-up's whole subtree is scaled down, the best first
    # token's up (capped at 1); the tree's order (and so its first chain) is unchanged.
    def fresh_sources() -> list:
        out = [ContextSource(context), JacobiSource(1, 3, context)]
        out[1].pool.add(3, (7, 7))  # type: ignore[attr-defined]
        return out

    uncorrected_cal = Calibrator(CalibrationConfig(siblings=False))  # the same evidence, no correction
    uncorrected_cal.hits, uncorrected_cal.reached = cal.hits, cal.reached
    uncorrected_cal._hits_sd, uncorrected_cal._reached_sd = cal._hits_sd, cal._reached_sd
    plain = SourcePool(fresh_sources(), PoolConfig(max_tokens=2, per_source=1), uncorrected_cal)
    uncorrected = plain.propose(context, 100).tree
    draft = SourcePool(fresh_sources(), PoolConfig(max_tokens=2, per_source=1), cal).propose(context, 100)
    f0, f1 = cal.sibling_factor(0), cal.sibling_factor(1)
    assert paths(draft.tree) == paths(uncorrected) == [(4, 5), (7, 7)]
    q = uncorrected.probs
    assert q[0] > q[2]  # context's 4 is now rank 0
    assert draft.tree.probs == pytest.approx([q[0] * f0, q[1] * f0, q[2] * f1, q[3] * f1])
    # Ranks 3 and beyond share one factor
    cal.observe_siblings([0.5, 0.4, 0.3, 0.2, 0.1], hit_rank=4)
    assert cal.sibling_factor(3) == cal.sibling_factor(7) == pytest.approx((1 + 3) / (0.2 * 0.98 + 0.1 + 3))


def test_first_tokens_that_several_sources_proposed_are_corrected_apart() -> None:
    # Rank-0 first tokens: proposed by one source (priced 0.5) they were right once in 10 steps; proposed by
    # two (priced 0.3) 8 times in 10. With `agreement` each kind has its own factor (observed + 3) /
    # (predicted + 3); without, one factor for both: (1 + 8 + 3) / (5 + 3 + 3).
    for agreement in (True, False):
        cal = Calibrator(CalibrationConfig(decay=1.0, agreement=agreement))
        for i in range(10):
            cal.observe_siblings([0.5], 0 if i == 0 else None, [False])
            cal.observe_siblings([0.3], 0 if i < 8 else None, [True])
        if agreement:
            assert cal.sibling_factor(0) == pytest.approx((1 + 3) / (5 + 3))  # 0.5
            assert cal.sibling_factor(0, agreed=True) == pytest.approx((8 + 3) / (3 + 3))  # 1.83
        else:
            assert cal.sibling_factor(0) == cal.sibling_factor(0, agreed=True) == pytest.approx(12 / 11)


def test_the_pool_tells_the_calibrator_which_first_tokens_two_sources_agreed_on() -> None:
    # (CalibrationConfig.agreement is off by default: it did not pay; this is its opt-in path.)
    # After ...1 2 3 the context source proposes 4 5 (what followed 1 2 3 before) and the Jacobi pool 4 9:
    # two sources, one first token (4). The prompt-lookup-only pool proposes 4 alone.
    context = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]
    outcome = StepOutcome(accepted=[4], accepted_sources=["model"], aux_out=[], query_tokens=1, candidate_tokens=0)
    for with_jacobi, agreed in ((True, True), (False, False)):
        sources: list = [ContextSource(context)]
        if with_jacobi:
            sources.append(JacobiSource(1, 3, context))
            sources[1].pool.add(3, (4, 9))
        cal = Calibrator(CalibrationConfig(agreement=True))
        pool = SourcePool(sources, PoolConfig(max_tokens=2, per_source=1), cal)
        pool.propose(context, 100)
        pool.update(context, outcome)  # the model went on with 4: the rank-0 first token was right
        # that evidence went to the factor of rank-0 first tokens that were (or were not) agreed on
        assert cal.sibling_factor(0, agreed=agreed) > 1.0
        assert cal.sibling_factor(0, agreed=not agreed) == 1.0


def test_cache_source_matches_the_class_cache() -> None:
    cache = NGramCache(NGramCacheConfig(key_lengths=(2, 1), num_tokens=3))
    cache.add_response([9], [1, 2, 3, 4])
    # the context ends in (1 2): the 2-token key (1 2) was followed by 3 4: feature 4*2 + rank 0
    assert [(c.tokens, c.source, c.feature) for c in CacheSource(cache).candidates([7, 1, 2], 3, 4)][0] == (
        (3, 4), "cache", 8)


def test_context_tokens_is_validated_and_counted_in_the_step_bound() -> None:
    with pytest.raises(ConfigError, match="context_tokens must be an integer >= 1"):
        LookaheadConfig(context_tokens=0)
    # 1 + W*(N-1) + G*max(N-1, context_tokens) = 1 + 2*3 + 4*8
    assert LookaheadConfig(2, 4, 4, context_tokens=8).query_tokens == 39
    assert LookaheadConfig(2, 4, 4, context_tokens=2).query_tokens == 1 + 6 + 12
    with pytest.raises(ConfigError, match="sources"):
        LookaheadConfig(sources=("context", "context"))
    assert LookaheadConfig(sources=["context"]).sources == ("context",)  # type: ignore[arg-type]


@pytest.mark.parametrize("make", [
    lambda v: LookaheadConfig(window=v), lambda v: LookaheadConfig(ngram=v), lambda v: LookaheadConfig(guesses=v),
    lambda v: LookaheadConfig(context_tokens=v), lambda v: GenerationConfig(max_new_tokens=v),
    lambda v: SamplingConfig(temperature=1.0, top_k=v), lambda v: SamplingConfig(temperature=1.0, seed=v),
    lambda v: PromptLookupConfig(num_tokens=v),
])
def test_integer_settings_refuse_bools_and_fractions(make: Callable[[object], object]) -> None:
    # True and 2.0 compare equal to 1 and 2, but neither is a count a user meant to pass: both are
    # refused with a message that asks for an integer, while the integer itself is accepted.
    make(4)  # the plain integer is fine
    for bad in (True, 2.0):
        with pytest.raises(ConfigError, match="integer"):
            make(bad)


def test_the_pool_learns_what_the_models_confidence_in_a_guessed_token_is_worth() -> None:
    # Context ... 1 2 3; the context source proposes 4 5 (what followed 1 2 3 before). With a recycling
    # source the engine reports top-k rows, from which the pool keeps the model's confidence.
    context = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]
    cal = Calibrator(CalibrationConfig(decay=1.0, confidence_decay=1.0))
    pool = SourcePool([ContextSource(context), RecyclingSource()], PoolConfig(max_tokens=2, per_source=1), cal)
    assert pool.top_k and pool.confidence is not None
    unaware = SourcePool([ContextSource(context)], PoolConfig(max_tokens=2, per_source=1), Calibrator())
    assert unaware.confidence is None  # no top-k rows reported: nothing to read the model's confidence from
    pool.propose(context, 100)  # offered before any row: both tokens in bucket 0 (unknown)
    (_, first, (first_rates, first_buckets)), = [x for x in pool.tracker._pending if x[1].source == "context"]
    assert first.tokens == (4, 5) and first_buckets == [0, 0]
    # The step accepted 4 and reported the row of 4 (after 3): 5 at logit 5, 8 at 0 (5 takes 0.993: bucket 6).
    pool.update(context + [4], StepOutcome(accepted=[4], accepted_sources=["context"], aux_out=[], query_tokens=2,
                                           candidate_tokens=1, successors=[(4, (5, 8))], predecessors=[(2, 3)],
                                           successor_logits=[(5.0, 0.0)]))
    # Next step, after ... 3 4: context proposes 5 6. The model computed a row after (3, 4), with 5 in
    # bucket 6; no row after 5 yet, so 6 is unknown.
    pool.propose(context + [4], 100)  # (the recycling source proposes 5 too, from the row: scored apart)
    (_, second, (rates, buckets)), = [x for x in pool.tracker._pending if x[1].source == "context" and x[0] == 1]
    assert second.tokens == (5, 6) and buckets == [6, 0]
    # The model goes on with 5 then 7: 4 5 was right throughout (bucket 0 at depths 1 and 2), 5 6 right at
    # depth 1 (bucket 6) and wrong at depth 2 (bucket 0). Each factor is (hits + 3) / (predicted + 3).
    pool.update(context + [4, 5, 7], StepOutcome(accepted=[5, 7], accepted_sources=["model", "model"], aux_out=[],
                                                 query_tokens=1, candidate_tokens=0))
    assert cal.confidence_factor("context", 1, 0) == pytest.approx((1 + 3) / (first_rates[0] + 3))
    assert cal.confidence_factor("context", 1, 6) == pytest.approx((1 + 3) / (rates[0] + 3))
    assert cal.confidence_factor("context", 2, 0) == pytest.approx((1 + 3) / (first_rates[1] + rates[1] + 3))
    assert cal.confidence_factor("context", 2, 6) == 1.0  # never seen
