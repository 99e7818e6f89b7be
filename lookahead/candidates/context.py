"""Copy sources: what followed the current suffix earlier in this request, or in earlier responses.

ContextSource ("context", prompt lookup): the last k tokens of the context (prompt + generated), for k
from the longest key down, looked up among every earlier position; what followed each earlier
occurrence is a candidate, most recent first.

CacheSource ("cache"): the same lookup in a cross-request n-gram cache (candidates/ngram_cache.py),
shared by the requests of one class.

Feature (the calibration bucket, engine/calibration.py): 4 * (matched key length) + min(rank, 3), so a
3-token match's first candidate and a 1-token match's fourth are calibrated apart.
"""

from __future__ import annotations

from collections.abc import Sequence

from lookahead.candidates.ngram_cache import NGramCache
from lookahead.candidates.ngrams import ContextIndex
from lookahead.engine.sources import Candidate, Observation


def _feature(key_length: int, rank: int) -> int:
    return 4 * key_length + min(rank, 3)


class ContextSource:
    name = "context"

    def __init__(self, prompt: Sequence[int], key_lengths: Sequence[int] = (3, 2, 1), max_hits: int = 8) -> None:
        self.index = ContextIndex(key_lengths, max_hits=max_hits)
        self.index.extend(prompt)

    def candidates(self, context: Sequence[int], max_tokens: int, limit: int) -> list[Candidate]:
        if max_tokens <= 0 or limit <= 0:
            return []
        found = self.index.matches(context, max_tokens, limit)
        return [Candidate(cont, self.name, _feature(k, rank)) for rank, (cont, k) in enumerate(found)]

    def observe(self, obs: Observation) -> None:
        self.index.extend(obs.accepted)


class CacheSource:
    name = "cache"

    def __init__(self, cache: NGramCache) -> None:
        self.cache = cache

    def candidates(self, context: Sequence[int], max_tokens: int, limit: int) -> list[Candidate]:
        found = self.cache.matches(context, max_tokens, limit)
        return [Candidate(cont, self.name, _feature(k, rank)) for rank, (cont, k) in enumerate(found)]

    def observe(self, obs: Observation) -> None:
        pass  # the cache learns a whole response when it finishes (lookahead/generation.py)
