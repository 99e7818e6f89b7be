"""Hand-written cases for the hidden-state store (candidates/states.py) and for the suffix source's
nearest-occurrence flag (candidates/suffix.py). States here are chosen by hand: unit vectors along axes,
so a cosine is 1 or 0. In the comments T is the text (positions 0-based; its last token is the root) and
s(i) the state reported for position i.

The suffix source's feature is 3 * length bucket + share bucket, + 15 when the path follows the
occurrence whose state before it, s(p - 1), is nearest to s(n - 2), the state of the row that chose the
root (the root itself has none yet).
"""

from __future__ import annotations

import torch

from lookahead.candidates.states import HiddenStates
from lookahead.candidates.suffix import SuffixSource, feature_of
from lookahead.engine.sources import WantsStates

# T: 5 1 2 (0..2), 6 1 3 (3..5), 7 1 (6..7). The suffix "1" (the root, at 7) occurred at 1 and at 4,
# followed by "2 6 1 3 7 1" and by "3 7 1"; "7 1" did not occur before. Each first token has share 1/2.
TEXT = [5, 1, 2, 6, 1, 3, 7, 1]


def axes(*dims: int, width: int = 4) -> torch.Tensor:
    """One state per position: the unit vector along each given axis."""
    return torch.eye(width)[list(dims)]


def test_the_store_finds_the_nearest_known_position() -> None:
    h = HiddenStates()
    h.observe(0, axes(0, 1, 2) * 3.0)  # lengths do not matter: stored as unit vectors
    assert h.count == 3 and h.known(2) and not h.known(3) and not h.known(-1)
    h.observe(5, axes(1))  # a gap: 3 and 4 stay unknown
    assert h.nearest(5, [0, 1, 2]) == 1
    assert h.nearest(5, [3, 4, 0]) == 0  # unknown ones are passed over
    assert h.nearest(5, [3, 4]) is None and h.nearest(4, [0, 1]) is None
    h.observe(1, axes(3))  # a later report replaces an earlier one
    assert h.nearest(5, [0, 1, 2]) == 0  # all at cosine 0 now: the first
    h.observe(1000, axes(0))  # grows past its first capacity
    assert h.known(1000) and not h.known(999) and h.count == 5
    h.clear()
    assert h.count == 0 and h.nearest(5, [0]) is None


def test_the_suffix_source_wants_states_only_when_told_to() -> None:
    assert isinstance(SuffixSource([1]), WantsStates) and SuffixSource([1], states=True).states
    assert not SuffixSource([1]).states


def test_the_path_of_the_nearer_occurrence_is_flagged() -> None:
    # s(6) = s(0) = axis 0, s(3) = axis 1: the state before the root matches the one before the OLDER
    # occurrence (p = 1), so its path "2 6 1" is flagged, though the order (counts tie, the newer first)
    # is unchanged. Match 1 -> length bucket 0; share 1/2 -> share bucket 1.
    src = SuffixSource(TEXT, states=True)
    src.observe_states(0, axes(0, 2, 2, 1, 2, 2, 0))  # positions 0..6; the root (7) has none yet
    cands = src.candidates(TEXT, 3, 4)
    assert [c.tokens for c in cands] == [(3, 7, 1), (2, 6, 1)]
    assert [c.feature for c in cands] == [feature_of(1, 0.5), feature_of(1, 0.5, True)] == [1, 16]
    # s(6) = s(3) instead: the newer occurrence's path is the flagged one.
    src.observe_states(6, axes(1))
    assert [c.feature for c in src.candidates(TEXT, 3, 4)] == [16, 1]


def test_without_states_nothing_is_flagged() -> None:
    # No reports (a model whose final norm the runner does not know), states off (the default), or no
    # state for the row that chose the root: the features are the plain ones.
    assert [c.feature for c in SuffixSource(TEXT, states=True).candidates(TEXT, 3, 4)] == [1, 1]
    off = SuffixSource(TEXT)
    off.observe_states(0, axes(0, 2, 2, 1, 2, 2, 0))
    assert [c.feature for c in off.candidates(TEXT, 3, 4)] == [1, 1]
    partial = SuffixSource(TEXT, states=True)
    partial.observe_states(0, axes(0, 2, 2, 1, 2, 2))  # s(6) missing
    assert [c.feature for c in partial.candidates(TEXT, 3, 4)] == [1, 1]


def test_a_shorter_guess_still_follows_the_nearer_occurrence() -> None:
    # max_tokens 1: the paths are "3" and "2"; the nearer occurrence's continuation cut to one token is
    # "2", so that one is flagged.
    src = SuffixSource(TEXT, states=True)
    src.observe_states(0, axes(0, 2, 2, 1, 2, 2, 0))
    assert [(c.tokens, c.feature) for c in src.candidates(TEXT, 1, 4)] == [((3,), 1), ((2,), 16)]


def test_only_level_zero_paths_are_flagged() -> None:
    # T: 7 1 5 9 (0..3), 4 1 2 8 (4..7), 4 1 3 (8..10), 4 1 (11..12). The longest match "4 1" ends at 5 and
    # at 9 (level 0: paths "2 8" and "3 4"); the shorter level (match "1" alone) adds the end 1 (path
    # "5 9"). s(11), before the root, equals s(0), before the level-1 occurrence, but the nearest is
    # looked for among level 0's only: s(4) (before p = 5) is nearer than s(8) (before p = 9) by a little.
    text = [7, 1, 5, 9, 4, 1, 2, 8, 4, 1, 3, 4, 1]
    e0, e1, e2 = torch.eye(4)[:3]
    states = [e0, e2, e2, e2, e1 + 0.1 * e0, e2, e2, e2, e1, e2, e2, e0]  # positions 0..11
    src = SuffixSource(text, states=True)
    src.observe_states(0, torch.stack(states))
    cands = src.candidates(text, 2, 4)
    assert [c.tokens for c in cands] == [(3, 4), (2, 8), (5, 9)]
    assert [c.feature >= 15 for c in cands] == [False, True, False]
