"""Recycled successors under sampling: each row is ordered by what the seeded rule would pick there.

Hand-written cases: the rule's noise is replaced by chosen values per position, so every expected
order below is worked out in the comment beside it (score = logit / temperature + noise).
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

import lookahead
from lookahead.candidates.recycling import RecyclingSource, SuccessorTable
from lookahead.config import SamplingConfig
from lookahead.engine.calibration import Calibrator
from lookahead.engine.sampling import TokenChooser
from lookahead.engine.sources import Observation
from lookahead.testing import ARCHS

from ..engine.helpers import model64

VOCAB = 32


class Noise(TokenChooser):
    """A chooser whose noise at each position is zero except where a test sets it."""

    def __init__(self, cfg: SamplingConfig, at: dict[int, dict[int, float]]) -> None:
        super().__init__(cfg, VOCAB)
        self.at = at
        self.asked: list[int] = []

    def noise_at(self, position: int, tokens: Sequence[int]) -> list[float]:  # what recycling reads
        self.asked.append(position)
        return [self.at.get(position, {}).get(t, 0.0) for t in tokens]


def sampled(noise: dict[int, dict[int, float]], **cfg: float) -> tuple[RecyclingSource, Noise]:
    chooser = Noise(SamplingConfig(**{"temperature": 1.0, "seed": 1, **cfg}), noise)  # type: ignore[arg-type]
    src = RecyclingSource(chooser=chooser)
    # The root 1 is followed by 2, 3, 4 (logits 2.0, 1.9, -5.0), and 3 by 5, 6 (logits 1.0, 0.0).
    src.observe(Observation(context=(0,), accepted=(), successors=[(1, (2, 3, 4)), (3, (5, 6))],
                            logits=[(2.0, 1.9, -5.0), (1.0, 0.0)]))
    return src, chooser


def firsts(src: RecyclingSource, context: tuple[int, ...]) -> list[int]:
    return [c.tokens[0] for c in src.candidates(context, max_tokens=1, limit=3)]


def test_no_noise_keeps_the_logit_order() -> None:
    # Zero noise everywhere: the scores are the logits, so the order is the rank order 2, 3, 4.
    src, _ = sampled({})
    assert firsts(src, (0, 1)) == [2, 3, 4]


def test_the_noise_at_the_guessed_position_reorders_the_row() -> None:
    # Context (0, 1): the first guessed token sits at position 2. Noise 0.5 on token 3 there: 3 scores
    # 1.9 + 0.5 = 2.4 > 2's 2.0 > 4's -5.0, so 3 comes first, and the feature (rank 0) follows the order.
    src, chooser = sampled({2: {3: 0.5}})
    cands = src.candidates((0, 1), max_tokens=1, limit=3)
    assert [c.tokens for c in cands] == [(3,), (2,), (4,)]
    assert [c.feature % 5 for c in cands] == [0, 1, 2]
    assert chooser.asked == [2]
    # The same noise one position later changes nothing here: context (0, 0, 1) guesses position 3.
    assert firsts(src, (0, 0, 1)) == [2, 3, 4]


def test_deeper_rows_use_their_own_positions() -> None:
    # Greedy chain from root 1 at context (0, 1): position 2 picks 3 (noise 0.5 as above), then 3's row
    # at position 3: 6 scores 0.0 + 2.0 > 5's 1.0, so the chain is (3, 6); at position 3 noise on
    # token 3 would not matter, and 5/6 at position 2 would not either.
    src, chooser = sampled({2: {3: 0.5, 6: 9.0}, 3: {6: 2.0, 3: 9.0}})
    assert src.candidates((0, 1), max_tokens=2, limit=1)[0].tokens == (3, 6)
    assert sorted(set(chooser.asked)) == [2, 3]


def test_tokens_outside_top_k_or_top_p_go_last() -> None:
    # Noise 10 on token 4 at position 2 makes it score 5.0, the best; but with top_k 2 only 2 and 3 can be
    # drawn, so 4 goes last: 2 (2.0) then 3 (1.9) then 4.
    src, _ = sampled({2: {4: 10.0}}, top_k=2)
    assert firsts(src, (0, 1)) == [2, 3, 4]
    # top_p 0.5: within the row, 2 alone holds exp(2.0) / (exp(2.0) + exp(1.9) + exp(-5.0)) = 0.525 >= 0.5
    # of the probability, so 3 and 4 are outside; noise 1.0 on 3 would put it first, yet 2 leads.
    src, _ = sampled({2: {3: 1.0}}, top_p=0.5)
    assert firsts(src, (0, 1)) == [2, 3, 4]
    # top_p 0.9 takes 2 and 3 (0.525 < 0.9, then 0.999): 3 leads again.
    src, _ = sampled({2: {3: 1.0}}, top_p=0.9)
    assert firsts(src, (0, 1)) == [3, 2, 4]


def test_temperature_divides_the_logits() -> None:
    # Temperature 0.1: logits 20, 19, -50; noise 0.5 on 3 is no longer enough (19.5 < 20), 5 would be.
    src, _ = sampled({2: {3: 0.5}}, temperature=0.1)
    assert firsts(src, (0, 1)) == [2, 3, 4]
    src, _ = sampled({2: {3: 5.0}}, temperature=0.1)
    assert firsts(src, (0, 1)) == [3, 2, 4]


def test_greedy_and_rows_without_logits_keep_the_rank_order() -> None:
    # A greedy chooser turns the ordering off; a row with no logits (another request's, or observed
    # without them) keeps its order under sampling too.
    greedy = RecyclingSource(chooser=TokenChooser(SamplingConfig(), VOCAB))
    greedy.observe(Observation(context=(0,), accepted=(), successors=[(1, (2, 3))], logits=[(2.0, 1.9)]))
    assert greedy.chooser is None and firsts(greedy, (0, 1)) == [2, 3]
    src, _ = sampled({2: {3: 0.5}})
    src.observe(Observation(context=(0,), accepted=(), successors=[(7, (8, 9))]))
    assert firsts(src, (0, 7)) == [8, 9]


@pytest.mark.parametrize("arch", ARCHS)
def test_sampled_lookahead_equals_sampled_autoregressive(arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The ordering only changes which guesses are offered first: the tokens are the rule's, as without it.
    lm = model64(arch)
    ids = lm.encode("abababababab", raw=True)
    cfg = SamplingConfig(temperature=1.0, top_p=0.9, seed=3)
    real = RecyclingSource._drawn_first
    moved = []

    def spy(self: RecyclingSource, row: tuple[int, ...], token: int, position: int) -> tuple[int, ...]:
        out = real(self, row, token, position)
        moved.append(out != row)
        return out

    monkeypatch.setattr(RecyclingSource, "_drawn_first", spy)
    ar = lookahead.generate(lm, ids, max_new_tokens=32, strategy="autoregressive", sampling=cfg)
    la = lookahead.generate(lm, ids, max_new_tokens=32, strategy="lookahead", sampling=cfg, calibrator=Calibrator(),
                            successors=SuccessorTable())
    assert la.token_ids == ar.token_ids
    assert any(moved), "the noise never reordered a row: nothing tested"
