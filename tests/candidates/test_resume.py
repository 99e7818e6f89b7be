"""Hand-written cases for the resume source (candidates/resume.py). In the comments T is the indexed
text, positions are 0-based, and "pointer h" means "the copy's next token is T[h]". With the default
anchor of 4, a pointer appears once the last 4 tokens of T also ended earlier.

Feature: 0 a substitution after one miss, 1 the same after a copy of at least `long_run` (default 8)
tokens, 2 an insertion after one miss, 3 any pointer after two misses.
"""

from __future__ import annotations

import random

import pytest

from lookahead.candidates.resume import ResumeSource
from lookahead.engine.sources import Candidate, CandidateSource, Observation

PASSAGE = [1, 2, 3, 4, 5, 6, 7, 9]  # positions 0..7


def toks(cands: list[Candidate]) -> list[tuple[int, ...]]:
    return [c.tokens for c in cands]


def test_is_a_candidate_source() -> None:
    assert isinstance(ResumeSource([1, 2]), CandidateSource)
    assert ResumeSource([]).name == "resume"


def test_an_unbroken_copy_offers_nothing() -> None:
    # T = PASSAGE, then 1 2 3 4 5: the 4-gram "1 2 3 4" ended at 3, so pointer 4; 5 matched T[4], so
    # pointer 5 (T[5] = 6) with no misses. The suffix source continues such a copy; this one stays quiet.
    text = PASSAGE + [1, 2, 3, 4, 5]
    assert ResumeSource(text).candidates(text, 4, 4) == []


def test_a_substituted_token_resumes_after_it_or_before_it() -> None:
    # T = PASSAGE, then 1 2 3 4 5 8: the copy expected 6 (pointer 5) and got 8. Substitution: 8 replaced
    # the 6, so the copy goes on at 7 (pointer 6); insertion: 8 came before the 6 (pointer 5). Both have
    # one miss and the same run, so the newer position (the substitution) comes first.
    text = PASSAGE + [1, 2, 3, 4, 5, 8]
    cands = ResumeSource(text).candidates(text, 3, 4)
    assert toks(cands) == [(7, 9, 1), (6, 7, 9)]
    assert [c.feature for c in cands] == [0, 2]  # run 5 < 8: the short substitution bucket
    assert all(c.source == "resume" for c in cands)


def test_limit_and_max_tokens_cut_the_guesses() -> None:
    text = PASSAGE + [1, 2, 3, 4, 5, 8]
    src = ResumeSource(text)
    assert toks(src.candidates(text, 2, 1)) == [(7, 9)]
    assert src.candidates(text, 0, 4) == [] and src.candidates(text, 4, 0) == []


def test_guesses_stop_at_the_end_of_the_text() -> None:
    # T = PASSAGE, 1 2 3 4 5 (8..12), 1 2 3 4 (13..16), 7 (17). The newest earlier "1 2 3 4" ended at 11,
    # so pointer 12 (T[12] = 5); 7 != 5: substitution 13, insertion 12. Their guesses run to the end of
    # T (5 and 6 tokens) rather than being padded to max_tokens.
    t = PASSAGE + [1, 2, 3, 4, 5, 1, 2, 3, 4, 7]
    cands = ResumeSource(t).candidates(t, 8, 4)
    assert toks(cands) == [(1, 2, 3, 4, 7), (5, 1, 2, 3, 4, 7)]


def test_a_left_out_token_realigns_without_a_guess() -> None:
    # T = PASSAGE, then 1 2 3 4 6: pointer 4 expected 5 and got 6, which is T[5]: the copy skipped the
    # 5, so pointer 6 has no misses (and, like any unbroken copy, offers nothing); the substitution
    # (pointer 5, guess 6 7 ...) and the insertion (pointer 4, guess 5 6 ...) are still offered.
    text = PASSAGE + [1, 2, 3, 4, 6]
    first = ResumeSource(text).candidates(text, 2, 4)
    assert toks(first) == [(6, 7), (5, 6)] and [c.feature for c in first] == [0, 2]
    # Next the copy goes on with 7 = T[6]: the deletion pointer matched, the others missed a second
    # time. Pointers with a miss are still offered, after those without (which offer nothing).
    text2 = text + [7]
    cands = ResumeSource(text2).candidates(text2, 2, 4)
    # substitution 5 -> miss again (T[5] = 6 != 7): pointers 6 (subst.) and 5 (ins.), two misses each;
    # insertion 4 -> miss again (T[4] = 5 != 7): pointers 5 and 4, and 5 is kept once.
    assert toks(cands) == [(7, 9), (6, 7), (5, 6)]
    assert [c.feature for c in cands] == [3, 3, 3]


def test_a_third_miss_drops_the_pointer() -> None:
    # max_misses = 2: after 8 and then 8 again the pointers have two misses; a third wrong token ends them.
    base = PASSAGE + [1, 2, 3, 4, 5]
    assert ResumeSource(base + [8, 8]).candidates(base + [8, 8], 2, 8) != []
    assert ResumeSource(base + [8, 8, 8]).candidates(base + [8, 8, 8], 2, 8) == []
    one = ResumeSource(base + [8, 8], max_misses=1)
    assert one.candidates(base + [8, 8], 2, 8) == []


def test_a_match_after_the_break_ends_the_guessing() -> None:
    # T = PASSAGE, 1 2 3 4 5 8 7: the substitution pointer 6 matched the 7, so it has no misses again
    # (the copy resumed); the insertion pointer 5 missed twice (6 != 7) and is still offered.
    text = PASSAGE + [1, 2, 3, 4, 5, 8, 7]
    cands = ResumeSource(text).candidates(text, 2, 4)
    assert (9, 1) not in toks(cands)  # pointer 7 has no misses
    assert cands and all(c.feature == 3 for c in cands)


def test_a_long_copy_gets_its_own_feature() -> None:
    # A copy of 10 tokens that then breaks: its run is >= long_run (8), so feature 1 (substitution).
    passage = list(range(10, 30))
    text = passage + [99] + passage[:10] + [77]
    cands = ResumeSource(text).candidates(text, 3, 1)
    assert toks(cands) == [(21, 22, 23)] and cands[0].feature == 1
    assert ResumeSource(text, long_run=64).candidates(text, 3, 1)[0].feature == 0


def test_identical_guesses_are_offered_once() -> None:
    # T = 1 2 3 4 5 5 5 5, then 1 2 3 4 8: pointer 4 expected 5 and got 8. The substitution (pointer 5)
    # and the insertion (pointer 4) both guess "5 5": offered once, as the substitution.
    text = [1, 2, 3, 4, 5, 5, 5, 5, 1, 2, 3, 4, 8]
    cands = ResumeSource(text).candidates(text, 2, 8)
    assert toks(cands) == [(5, 5)] and cands[0].feature == 0


def test_observe_follows_the_context_and_another_context_starts_over() -> None:
    src = ResumeSource(PASSAGE)
    context = PASSAGE + [1, 2, 3, 4, 5]
    src.observe(Observation(context=context, accepted=context[-5:]))
    assert src.candidates(context, 3, 4) == []
    context = context + [8]
    src.observe(Observation(context=context, accepted=[8]))
    assert toks(src.candidates(context, 3, 4)) == [(7, 9, 1), (6, 7, 9)]
    other = [40, 41, 42]  # not an extension: the index is rebuilt for it
    assert src.candidates(other, 3, 4) == []
    assert src.candidates(context, 3, 4) == ResumeSource(context).candidates(context, 3, 4)


def test_every_guess_is_a_span_of_the_text_after_a_broken_copy() -> None:
    rng = random.Random(5)
    for _ in range(30):
        passage = [rng.randrange(6) for _ in range(40)]
        text = list(passage)
        for _ in range(40):  # copy stretches of the passage with occasional changes
            text.append(passage[len(text) % 40] if rng.random() < 0.85 else rng.randrange(6))
        src = ResumeSource([])
        for n in range(1, len(text) + 1):
            for c in src.candidates(text[:n], 5, 4):
                k = len(c.tokens)
                assert 1 <= k <= 5 and 0 <= c.feature < 4
                assert any(text[h : h + k] == list(c.tokens) for h in range(n - k + 1))
        incremental = src.candidates(text, 5, 4)
        assert incremental == ResumeSource(text).candidates(text, 5, 4)


@pytest.mark.parametrize("kwargs", [{"anchor": 0}, {"max_misses": 0}, {"max_hypotheses": 0}, {"long_run": 0}])
def test_bad_settings_are_refused(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        ResumeSource([1, 2, 3], **kwargs)
