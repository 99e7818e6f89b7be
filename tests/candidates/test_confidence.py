"""The model's confidence in guessed tokens (candidates/confidence.py): hand-written rows and paths,
with the reason for each expected bucket."""

from __future__ import annotations

import math

import pytest

from lookahead.candidates.confidence import ABSENT, BUCKETS, UNKNOWN, ModelConfidence, bucket_of
from lookahead.engine.sources import Observation


def _obs(rows: list[tuple[int, tuple[int, ...], tuple[float, ...], tuple[int, ...]]]) -> Observation:
    """A step's rows: (input token, top-k tokens, their logits, tokens before it on its path)."""
    return Observation(context=[], accepted=[], successors=[(t, nxt) for t, nxt, _, _ in rows],
                       predecessors=[before for *_, before in rows], logits=[values for _, _, values, _ in rows])


@pytest.mark.parametrize(("p", "bucket"), [(0.0, 2), (0.0999, 2), (0.1, 3), (0.29, 3), (0.3, 4), (0.6, 5),
                                           (0.8999, 5), (0.9, 6), (1.0, 6)])
def test_buckets_follow_the_edges_each_edge_opening_its_bucket(p: float, bucket: int) -> None:
    assert bucket_of(p) == bucket < BUCKETS


def test_a_token_is_bucketed_by_its_share_of_the_row_the_model_computed_after_its_parent() -> None:
    conf = ModelConfidence()
    # After token 3 (itself after 1) the model's two best were 5 and 6 with logits 2 and 0:
    # softmax over them gives 5 e^2 / (e^2 + 1) = 0.881 (bucket 5: [.6, .9)) and 6 0.119 (bucket 3).
    conf.observe(_obs([(3, (5, 6), (2.0, 0.0), (1,))]))
    assert conf.path([1, 3], [5]) == [5]
    assert conf.path([1, 3], [6]) == [3]
    assert conf.path([1, 3], [7]) == [ABSENT]  # the model computed a row after 3, and 7 was not in it
    assert conf.path([1, 4], [5]) == [UNKNOWN]  # no row after 4 at all


def test_a_row_after_the_same_pair_wins_over_the_tokens_newest_row() -> None:
    conf = ModelConfidence()
    conf.observe(_obs([(3, (5, 6), (2.0, 0.0), (1,))]))  # after (1, 3): 5 likely
    conf.observe(_obs([(3, (6, 5), (9.0, 0.0), (2,))]))  # after (2, 3): 6 almost certain, and 3's newest row
    assert conf.path([1, 3], [5]) == [5]  # the (1, 3) row: 0.881
    assert conf.path([2, 3], [5]) == [2]  # the (2, 3) row: e^0 / (e^9 + 1) = 0.0001
    assert conf.path([8, 3], [6]) == [6]  # no (8, 3) row: token 3's newest, where 6 took 0.9999


def test_deeper_tokens_are_looked_up_after_the_guessed_tokens_before_them() -> None:
    conf = ModelConfidence()
    conf.observe(_obs([(3, (5,), (1.0,), (1,)), (5, (7, 8), (0.0, 0.0), (3,))]))
    # Guess 5, 7 after context [1, 3]: 5 is the only token of (1, 3)'s row (1.0: bucket 6); 7 is looked up
    # in the row after (3, 5), where 7 and 8 tie at 0.5 (bucket 4); 9 after (5, 7): no row.
    assert conf.path([1, 3], [5, 7, 9]) == [6, 4, UNKNOWN]


def test_steps_without_logits_teach_nothing_and_rows_are_bounded_oldest_first() -> None:
    conf = ModelConfidence(max_rows=2)
    conf.observe(Observation(context=[], accepted=[], successors=[(3, (5,))]))  # no logits: ignored
    assert conf.rows == {}
    conf.observe(_obs([(3, (5,), (0.0,), ())]))  # no path before it (an aux row): keyed by the token alone
    conf.observe(_obs([(4, (6,), (0.0,), ())]))
    conf.observe(_obs([(3, (7,), (0.0,), ())]))  # rewritten: now the newest
    conf.observe(_obs([(9, (1,), (0.0,), ())]))  # a third key: the oldest written (4) goes
    assert set(conf.rows) == {(3,), (9,)}
    assert conf.path([0, 3], [7]) == [6]


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="max_rows"):
        ModelConfidence(max_rows=0)


def test_probabilities_are_a_softmax_over_the_rows_tokens_only() -> None:
    conf = ModelConfidence()
    # Four tokens at logits 0, ln 2, ln 3, ln 4: shares 0.1, 0.2, 0.3, 0.4 (the tail beyond the row unknown).
    conf.observe(_obs([(3, (10, 11, 12, 13), (0.0, math.log(2), math.log(3), math.log(4)), (1,))]))
    assert [conf.path([1, 3], [t])[0] for t in (10, 11, 12, 13)] == [bucket_of(x) for x in (0.1, 0.2, 0.3, 0.4)]
