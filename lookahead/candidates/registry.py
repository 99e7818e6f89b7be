"""The one registry: source names -> candidate sources, strategy names -> proposers.

A new free source is one factory in SOURCES (plus its module and tests); a strategy built from free
sources names them in STRATEGY_SOURCES. Every strategy runs through the same step routine
(engine/step.py); the engine never imports this module (the generation loop in lookahead/generation.py
does).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lookahead.candidates.context import CacheSource, ContextSource
from lookahead.candidates.lookahead import JacobiSource
from lookahead.candidates.ngram_cache import NGramCache
from lookahead.candidates.pool import PoolConfig, SourcePool
from lookahead.candidates.recycling import RecyclingSource, SuccessorTable
from lookahead.candidates.resume import ResumeSource
from lookahead.candidates.speculative import SpeculativeProposer
from lookahead.candidates.suffix import SuffixSource
from lookahead.config import STRATEGIES, GenerationConfig
from lookahead.engine.calibration import Calibrator
from lookahead.engine.draft import CandidateTree, Draft, Proposer, StepOutcome
from lookahead.engine.sampling import TokenChooser
from lookahead.engine.sources import CandidateSource
from lookahead.errors import ConfigError
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
    ngram_cache: NGramCache | None = None  # cross-request n-grams (the "cache" source)
    calibrator: Calibrator | None = None  # shared by a request class; None: this request's own
    successors: SuccessorTable | None = None  # recycled successors, shared likewise; None: this request's own


def _jacobi(x: ProposerInputs) -> CandidateSource:
    lk = x.cfg.lookahead
    return JacobiSource(lk.window, lk.ngram, x.prompt, lk.max_pool_per_key)


def _context(x: ProposerInputs) -> CandidateSource:
    pl = x.cfg.prompt_lookup
    if x.cfg.strategy == "prompt_lookup":
        return ContextSource(x.prompt, range(pl.min_ngram, pl.max_ngram + 1), max_hits=max(8, pl.max_candidates))
    return ContextSource(x.prompt)


SOURCES: dict[str, Callable[[ProposerInputs], CandidateSource | None]] = {
    "context": _context,
    "cache": lambda x: CacheSource(x.ngram_cache) if x.ngram_cache is not None else None,
    "jacobi": _jacobi,
    "recycle": lambda x: RecyclingSource(table=x.successors, chooser=x.chooser),
    "suffix": lambda x: SuffixSource(x.prompt, states=x.cfg.lookahead.hidden_states),
    "resume": lambda x: ResumeSource(x.prompt),
}

# Sources that copy spans of text (turned off by LookaheadConfig.context_ngrams=False).
COPY_SOURCES = ("context", "suffix", "cache", "resume")

# Free-source strategies and the sources they draw from ("lookahead" takes LookaheadConfig.sources).
STRATEGY_SOURCES: dict[str, tuple[str, ...]] = {
    "lookahead_jacobi": ("jacobi",),
    "prompt_lookup": ("context", "cache"),
}


def source_names() -> tuple[str, ...]:
    return tuple(SOURCES)


def _pool(x: ProposerInputs) -> Proposer:
    cfg = x.cfg
    names = cfg.lookahead.sources if cfg.strategy == "lookahead" else STRATEGY_SOURCES[cfg.strategy]
    if cfg.strategy == "lookahead" and not cfg.lookahead.context_ngrams:  # the paper's Jacobi-only pool
        names = tuple(n for n in names if n not in COPY_SOURCES)
    unknown = [n for n in names if n not in SOURCES]
    if unknown:
        raise ConfigError(f"unknown candidate source(s) {', '.join(unknown)}; choose from {', '.join(SOURCES)}")
    built = [SOURCES[n](x) for n in names]
    sources = [s for s in built if s is not None]  # e.g. "cache" without a cross-request cache
    if cfg.strategy == "prompt_lookup":
        pool = PoolConfig(max_tokens=cfg.prompt_lookup.num_tokens, per_source=cfg.prompt_lookup.max_candidates,
                          allocate=cfg.adaptive)
    else:
        lk = cfg.lookahead
        # The paper's algorithm (lookahead_jacobi) runs its window and verifies its G n-grams every step.
        pool = PoolConfig(max_tokens=lk.candidate_tokens, per_source=lk.guesses,
                          allocate=cfg.adaptive and cfg.strategy == "lookahead")
    # The model's confidence in guessed tokens is kept with the recycled successors it comes from: shared
    # where they are (a class, or a model's requests), the request's own otherwise.
    confidence = x.successors.confidence if x.successors is not None else None
    return SourcePool(sources, pool, x.calibrator or Calibrator(), confidence)


def _speculative(x: ProposerInputs) -> Proposer:
    spec = x.cfg.speculative
    needed = len(x.prompt) + x.cfg.max_new_tokens + spec.draft_tokens
    model = resolve_draft(x.target, spec, x.draft, needed_context=needed)
    return SpeculativeProposer(model, spec.draft_tokens, x.chooser)


_FACTORIES: dict[str, Callable[[ProposerInputs], Proposer]] = {
    "autoregressive": lambda x: NoDraft(),
    "lookahead": _pool,
    "lookahead_jacobi": _pool,
    "prompt_lookup": _pool,
    "speculative": _speculative,
}
assert set(_FACTORIES) == set(STRATEGIES)


def make_proposer(inputs: ProposerInputs) -> Proposer:
    return _FACTORIES[inputs.cfg.strategy](inputs)
