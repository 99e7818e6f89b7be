"""A cheap score that lets candidate sources compete for a step's verification slots.

Each source (Jacobi n-grams, context n-grams, cross-request n-grams, ...) hands over its candidates
best first (most recent, longest match). A candidate's score is

    rate(source) * recency ** rank

where `rate` is a running average of the tokens one candidate of that source got accepted per step
(so a source that keeps hitting wins slots, one that keeps missing loses them) and `rank` is the
candidate's place in its source's own list. The best `limit` distinct candidates are verified.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from lookahead.engine.draft import StepOutcome

# Starting rates (tokens accepted per candidate): context matches have been the best source on
# every workload measured so far, cross-request n-grams come next, Jacobi n-grams last.
DEFAULT_PRIORS: Mapping[str, float] = {"context": 1.0, "cache": 0.8, "jacobi": 0.5}
_FLOOR = 0.02  # a source that missed for a while still gets a slot when nobody else has a candidate


class SourceScores:
    """Running acceptance per source, and the merge of per-source candidate lists by score."""

    def __init__(self, priors: Mapping[str, float] = DEFAULT_PRIORS, decay: float = 0.8, recency: float = 0.7) -> None:
        if not 0.0 <= decay < 1.0 or not 0.0 < recency <= 1.0:
            raise ValueError(f"decay must be in [0, 1) and recency in (0, 1], got {decay}, {recency}")
        self.rates: dict[str, float] = dict(priors)
        self.decay = decay
        self.recency = recency
        self._offered: Counter[str] = Counter()

    def rate(self, source: str) -> float:
        return max(self.rates.get(source, 0.5), _FLOOR)

    def select(self, lists: Mapping[str, Sequence[tuple[int, ...]]], limit: int) -> list[tuple[str, tuple[int, ...]]]:
        """Up to `limit` (source, candidate) pairs, best score first. A candidate equal to, or a prefix
        of, one already chosen is skipped (it would add nothing to the trie)."""
        scored = [
            (self.rate(source) * self.recency**rank, -order, rank, source, cand)
            for order, (source, cands) in enumerate(lists.items())
            for rank, cand in enumerate(cands)
            if cand
        ]
        scored.sort(key=lambda item: (item[0], item[1], -item[2]), reverse=True)
        chosen: list[tuple[str, tuple[int, ...]]] = []
        for *_, source, cand in scored:
            if len(chosen) == limit:
                break
            if any(other[: len(cand)] == cand for _, other in chosen):
                continue
            chosen.append((source, cand))
        self._offered = Counter(source for source, _ in chosen)
        return chosen

    def observe(self, outcome: StepOutcome) -> None:
        """Credit the sources of the last `select` with the tokens they got accepted this step."""
        accepted = Counter(s for s in outcome.accepted_sources if s != "model")
        for source, offered in self._offered.items():
            hit = accepted[source] / offered
            self.rates[source] = self.decay * self.rates.get(source, 0.5) + (1.0 - self.decay) * hit
        self._offered = Counter()
