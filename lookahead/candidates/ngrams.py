"""N-gram stores that candidate sources draw from.

NGramPool: n-grams keyed by their first token, most recent first (the paper's pool).
ContextIndex: every position of the context (prompt + generated) indexed by its preceding tokens,
so that "what followed the last time we saw these tokens" is one dict lookup (prompt lookup).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence


class NGramPool:
    """first token -> continuations (tuples of N-1 tokens), most recently added last, bounded per key."""

    def __init__(self, max_per_key: int) -> None:
        self.max_per_key = max_per_key
        self._pool: dict[int, OrderedDict[tuple[int, ...], None]] = {}

    def add(self, first: int, continuation: tuple[int, ...]) -> None:
        bucket = self._pool.setdefault(first, OrderedDict())
        if continuation in bucket:
            bucket.move_to_end(continuation)
            return
        bucket[continuation] = None
        if len(bucket) > self.max_per_key:
            bucket.popitem(last=False)

    def get(self, first: int, limit: int) -> list[tuple[int, ...]]:
        """Up to `limit` continuations of `first`, most recent first."""
        bucket = self._pool.get(first)
        if not bucket or limit <= 0:
            return []
        out: list[tuple[int, ...]] = []
        for cont in reversed(bucket):
            out.append(cont)
            if len(out) == limit:
                break
        return out

    def __len__(self) -> int:
        return sum(len(b) for b in self._pool.values())


class ContextIndex:
    """For each key length k in `key_lengths`, maps the k tokens before a position to the positions
    that followed them (most recent last). Feed it the context as it grows with `extend`."""

    def __init__(self, key_lengths: Sequence[int] = (3, 2, 1), max_hits: int = 8) -> None:
        self.key_lengths = tuple(sorted(set(key_lengths), reverse=True))
        self.max_hits = max_hits
        self._index: dict[tuple[int, ...], list[int]] = {}
        self._tokens: list[int] = []

    def extend(self, tokens: Sequence[int]) -> None:
        for tok in tokens:
            self._tokens.append(int(tok))
            end = len(self._tokens) - 1  # position of the token just added
            for k in self.key_lengths:
                if end - k < 0:
                    continue
                # the k tokens before position `end` predict the token at `end`
                hits = self._index.setdefault(tuple(self._tokens[end - k : end]), [])
                hits.append(end)
                if len(hits) > self.max_hits:
                    del hits[0]

    def lookup(self, context: Sequence[int], length: int, limit: int) -> list[tuple[int, ...]]:
        """Continuations (up to `length` tokens) of the longest suffix of `context` seen before,
        longest key first, most recent occurrence first; at most `limit`, no duplicates."""
        return [cont for cont, _ in self.matches(context, length, limit)]

    def matches(self, context: Sequence[int], length: int, limit: int) -> list[tuple[tuple[int, ...], int]]:
        """As `lookup`, with the length of the key each continuation matched."""
        out: list[tuple[tuple[int, ...], int]] = []
        seen: set[tuple[int, ...]] = set()
        n = len(self._tokens)
        for k in self.key_lengths:
            if len(context) < k:
                continue
            for start in reversed(self._index.get(tuple(context[-k:]), ())):
                cont = tuple(self._tokens[start : min(start + length, n)])
                # skip the trivial match of the suffix with itself (nothing follows it yet)
                if cont and cont not in seen:
                    seen.add(cont)
                    out.append((cont, k))
                    if len(out) == limit:
                        return out
        return out
