"""Strategy name -> candidate source. Every strategy runs through the same step routine."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lookahead.candidates.lookahead import LookaheadProposer
from lookahead.candidates.ngram_cache import NGramCache
from lookahead.candidates.prompt_lookup import PromptLookupProposer
from lookahead.candidates.speculative import SpeculativeProposer
from lookahead.config import STRATEGIES, GenerationConfig
from lookahead.engine.draft import CandidateTree, Draft, Proposer, StepOutcome
from lookahead.engine.sampling import TokenChooser
from lookahead.models.drafts import resolve_draft
from lookahead.models.loader import LoadedModel


class NoDraft:
    """Autoregressive decoding: no candidates; every step is one query token."""

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        return Draft(tree=CandidateTree())

    def update(self, context: Sequence[int], outcome: StepOutcome) -> None:
        pass


@dataclass(frozen=True)
class ProposerInputs:
    """What a strategy may build its candidate source from."""

    cfg: GenerationConfig
    prompt: Sequence[int]
    target: LoadedModel
    chooser: TokenChooser  # the target's token rule (a draft model uses the same one)
    draft: LoadedModel | None = None  # an explicit draft model for "speculative"
    ngram_cache: NGramCache | None = None  # cross-request n-grams for "lookahead" and "prompt_lookup"


def _lookahead_jacobi(x: ProposerInputs) -> Proposer:
    return LookaheadProposer(dataclasses.replace(x.cfg.lookahead, context_ngrams=False), x.prompt)


def _speculative(x: ProposerInputs) -> Proposer:
    spec = x.cfg.speculative
    needed = len(x.prompt) + x.cfg.max_new_tokens + spec.draft_tokens
    model = resolve_draft(x.target, spec, x.draft, needed_context=needed)
    return SpeculativeProposer(model, spec.draft_tokens, x.chooser)


_FACTORIES: dict[str, Callable[[ProposerInputs], Proposer]] = {
    "autoregressive": lambda x: NoDraft(),
    "lookahead": lambda x: LookaheadProposer(x.cfg.lookahead, x.prompt, cache=x.ngram_cache),
    "lookahead_jacobi": _lookahead_jacobi,
    "prompt_lookup": lambda x: PromptLookupProposer(x.cfg.prompt_lookup, x.prompt, cache=x.ngram_cache),
    "speculative": _speculative,
}
assert set(_FACTORIES) == set(STRATEGIES)


def make_proposer(inputs: ProposerInputs) -> Proposer:
    return _FACTORIES[inputs.cfg.strategy](inputs)
