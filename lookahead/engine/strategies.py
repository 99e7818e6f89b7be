"""Strategy name -> candidate source. Every strategy runs through the same step routine."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from lookahead.candidates.lookahead import LookaheadProposer
from lookahead.config import STRATEGIES, GenerationConfig
from lookahead.engine.draft import CandidateTree, Draft, Proposer, StepOutcome


class NoDraft:
    """Autoregressive decoding: no candidates; every step is one query token."""

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        return Draft(tree=CandidateTree())

    def update(self, context: Sequence[int], outcome: StepOutcome) -> None:
        pass


_FACTORIES: dict[str, Callable[[GenerationConfig, Sequence[int]], Proposer]] = {
    "autoregressive": lambda cfg, prompt: NoDraft(),
    "lookahead": lambda cfg, prompt: LookaheadProposer(cfg.lookahead, prompt),
}
assert set(_FACTORIES) == set(STRATEGIES)


def make_proposer(cfg: GenerationConfig, prompt: Sequence[int]) -> Proposer:
    return _FACTORIES[cfg.strategy](cfg, prompt)
