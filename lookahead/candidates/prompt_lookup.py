"""Prompt lookup's candidate source: what followed the current suffix earlier in the context.

The last n tokens of the context (prompt + generated text), for n from max_ngram down to min_ngram,
are looked up among every earlier position; the tokens that followed each earlier occurrence are a
candidate. Several matches are verified at once as one trie. With a cross-request n-gram cache, its
continuations compete with the context's for the candidate slots (see ranking.SourceScores).
"""

from __future__ import annotations

from typing import Sequence

from lookahead.candidates.ngram_cache import NGramCache
from lookahead.candidates.ngrams import ContextIndex
from lookahead.candidates.ranking import SourceScores
from lookahead.config import PromptLookupConfig
from lookahead.engine.draft import CandidateTree, Draft, StepOutcome


class PromptLookupProposer:
    def __init__(self, cfg: PromptLookupConfig, prompt: Sequence[int], cache: NGramCache | None = None) -> None:
        self.cfg = cfg
        self.index = ContextIndex(range(cfg.min_ngram, cfg.max_ngram + 1), max_hits=max(8, cfg.max_candidates))
        self.index.extend(prompt)
        self.cache = cache
        self.scores = SourceScores()

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        tree = CandidateTree()
        length = min(self.cfg.num_tokens, budget)
        if length <= 0:
            return Draft(tree=tree)
        limit = self.cfg.max_candidates
        lists = {"context": self.index.lookup(context, length, limit)}
        if self.cache is not None:
            lists["cache"] = self.cache.lookup(context, length, limit)
        for source, cand in self.scores.select(lists, limit):
            tree.add(cand, source)
        return Draft(tree=tree)

    def update(self, context: Sequence[int], outcome: StepOutcome) -> None:
        self.index.extend(outcome.accepted)
        self.scores.observe(outcome)
