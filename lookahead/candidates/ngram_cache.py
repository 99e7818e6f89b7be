"""A cross-request n-gram cache: what followed a few tokens in earlier responses of the same class.

Templated and repetitive traffic (the same JSON skeleton, the same boilerplate code, the same
closing sentence) repeats n-grams across requests that no single prompt contains. The cache keeps
entries (key, continuation): `key` is 1..3 tokens, `continuation` the up to `num_tokens` tokens that
followed it in a finished response. It is bounded: at most `max_entries` entries, least recently
used first out (an entry is used when a response contains it again), and at most `max_per_key`
continuations per key. Candidates from it are verified like any other, so a stale or foreign entry
costs a verification slot, never a wrong token.

`NGramCaches` keeps one cache per request class, for the classes that opted in, and saves/loads
them as one JSON file.
"""

from __future__ import annotations

import json
import sys
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lookahead.cachefile import write_private_json
from lookahead.errors import ConfigError

FILE_VERSION = 1
Entry = tuple[tuple[int, ...], tuple[int, ...]]
# Bookkeeping besides the key and continuation tuples, fitted to tracemalloc (first on CPython 3.12;
# the tests run 3.11): per entry (its LRU and bucket slots, the entry tuple, token int objects) and per
# key (its bucket dict). The reported bytes must stay within 0.75-1.35x of what tracemalloc measures
# (tests/engine/test_candidates.py::test_cache_memory_is_bounded_and_reported).
_ENTRY_OVERHEAD = 220
_BUCKET_BYTES = 180


@dataclass(frozen=True)
class NGramCacheConfig:
    """max_entries: entries kept (the memory bound); key_lengths: context suffix lengths that index
    the cache, longest tried first; num_tokens: tokens per continuation; max_per_key: continuations kept
    per key (the most recently seen)."""

    max_entries: int = 50_000
    key_lengths: tuple[int, ...] = (3, 2, 1)
    num_tokens: int = 8
    max_per_key: int = 4

    def __post_init__(self) -> None:
        for name in ("max_entries", "num_tokens", "max_per_key"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"n-gram cache {name} must be an integer >= 1, got {value!r}")
        if not self.key_lengths or any(not isinstance(k, int) or not 1 <= k <= 16 for k in self.key_lengths):
            raise ConfigError(f"n-gram cache key_lengths must be integers in [1, 16], got {self.key_lengths!r}")
        object.__setattr__(self, "key_lengths", tuple(sorted(set(self.key_lengths), reverse=True)))


class NGramCache:
    """Bounded LRU store of (key, continuation) entries; thread-safe."""

    def __init__(self, config: NGramCacheConfig | None = None) -> None:
        self.config = config or NGramCacheConfig()
        self._lru: OrderedDict[Entry, None] = OrderedDict()  # least recently used first
        self._index: dict[tuple[int, ...], dict[tuple[int, ...], None]] = {}  # insertion-ordered buckets
        self._bytes = 0
        self._lock = threading.Lock()

    # -- writing ---------------------------------------------------------------------------------
    def add_response(self, prompt: Sequence[int], response: Sequence[int]) -> None:
        """Learn a finished response: every position of it, keyed by the tokens before it (the
        prompt's last tokens key the response's first positions)."""
        tail = [int(t) for t in prompt[-max(self.config.key_lengths):]]
        seq = tail + [int(t) for t in response]
        m = self.config.num_tokens
        with self._lock:
            for j in range(len(tail), len(seq)):
                cont = tuple(seq[j : j + m])
                for k in self.config.key_lengths:
                    if j - k >= 0:
                        self._put(tuple(seq[j - k : j]), cont)

    def _put(self, key: tuple[int, ...], cont: tuple[int, ...]) -> None:
        entry = (key, cont)
        bucket = self._index.get(key)
        if bucket is None:
            bucket = self._index[key] = {}
            self._bytes += _BUCKET_BYTES
        elif cont in bucket:
            del bucket[cont]
            bucket[cont] = None  # now the most recent of its key
            self._lru.move_to_end(entry)
            return
        bucket[cont] = None
        self._lru[entry] = None
        self._bytes += _entry_bytes(entry)
        if len(bucket) > self.config.max_per_key:
            self._drop((key, next(iter(bucket))))
        while len(self._lru) > self.config.max_entries:
            self._drop(next(iter(self._lru)))

    def _drop(self, entry: Entry) -> None:
        key, cont = entry
        del self._lru[entry]
        bucket = self._index[key]
        del bucket[cont]
        if not bucket:
            del self._index[key]
            self._bytes -= _BUCKET_BYTES
        self._bytes -= _entry_bytes(entry)

    # -- reading ---------------------------------------------------------------------------------
    def lookup(self, context: Sequence[int], length: int, limit: int) -> list[tuple[int, ...]]:
        """Continuations (cut to `length` tokens) of the longest suffix of `context` that is a key,
        then of shorter suffixes; most recently seen first; at most `limit`; none that is a prefix
        of one already returned."""
        return [cont for cont, _ in self.matches(context, length, limit)]

    def matches(self, context: Sequence[int], length: int, limit: int) -> list[tuple[tuple[int, ...], int]]:
        """As `lookup`, with the length of the key each continuation matched."""
        out: list[tuple[tuple[int, ...], int]] = []
        if length <= 0 or limit <= 0:
            return out
        with self._lock:
            for k in self.config.key_lengths:
                if len(context) < k:
                    continue
                for cont in reversed(self._index.get(tuple(context[-k:]), ())):
                    cand = cont[:length]
                    if any(prev[: len(cand)] == cand for prev, _ in out):
                        continue
                    out.append((cand, k))
                    if len(out) == limit:
                        return out
        return out

    def __len__(self) -> int:
        return len(self._lru)

    def memory(self) -> dict[str, int]:
        """{"entries": n, "bytes": approximate bytes held (tuples plus bookkeeping)}."""
        return {"entries": len(self._lru), "bytes": self._bytes}

    # -- files -----------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        with self._lock:
            entries = [[list(k), list(c)] for k, c in self._lru]  # least recently used first
        cfg = self.config
        return {"key_lengths": list(cfg.key_lengths), "num_tokens": cfg.num_tokens, "max_entries": cfg.max_entries,
                "max_per_key": cfg.max_per_key, "entries": entries}

    @classmethod
    def from_json(cls, data: Any, where: str = "n-gram cache") -> NGramCache:
        try:
            cfg = NGramCacheConfig(max_entries=data["max_entries"], key_lengths=tuple(data["key_lengths"]),
                                   num_tokens=data["num_tokens"], max_per_key=data["max_per_key"])
            cache = cls(cfg)
            for key, cont in data["entries"]:
                if not key or not cont or not all(isinstance(t, int) and t >= 0 for t in [*key, *cont]):
                    raise ValueError("entries must be pairs of non-empty token id lists")
                cache._put(tuple(key), tuple(cont))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{where} is not a valid n-gram cache ({type(exc).__name__}: {exc}); "
                              "delete the file or point to another one") from None
        return cache

    def save(self, path: str | Path) -> None:
        _write(Path(path), {"version": FILE_VERSION, "cache": self.to_json()})

    @classmethod
    def load(cls, path: str | Path) -> NGramCache:
        return cls.from_json(_read(Path(path)).get("cache"), where=str(path))


class NGramCaches:
    """One NGramCache per request class that opted in; other classes get None (no cache)."""

    def __init__(self, classes: Iterable[str], config: NGramCacheConfig | None = None) -> None:
        self._caches = {c: NGramCache(config) for c in classes}

    def get(self, request_class: str) -> NGramCache | None:
        return self._caches.get(request_class)

    @property
    def classes(self) -> tuple[str, ...]:
        return tuple(self._caches)

    def opt_in(self, classes: Iterable[str], config: NGramCacheConfig | None = None) -> None:
        """Exactly `classes` keep a cache: each gets its loaded one or an empty one; others are dropped."""
        wanted = list(classes)
        self._caches = {c: self._caches[c] if c in self._caches else NGramCache(config) for c in wanted}

    def memory(self) -> dict[str, dict[str, int]]:
        return {c: cache.memory() for c, cache in self._caches.items()}

    def save(self, path: str | Path) -> None:
        _write(Path(path), {"version": FILE_VERSION, "classes": {c: x.to_json() for c, x in self._caches.items()}})

    @classmethod
    def load(cls, path: str | Path) -> NGramCaches:
        data = _read(Path(path)).get("classes")
        if not isinstance(data, dict):
            raise ConfigError(f"{path} has no 'classes' mapping; was it written by NGramCaches.save?")
        out = cls(())
        out._caches = {c: NGramCache.from_json(v, where=f"{path} class {c!r}") for c, v in data.items()}
        return out


def _entry_bytes(entry: Entry) -> int:
    return sys.getsizeof(entry[0]) + sys.getsizeof(entry[1]) + _ENTRY_OVERHEAD


def _write(path: Path, data: dict[str, Any]) -> None:
    write_private_json(path, data)  # owner-only: the entries are pieces of users' responses


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"no n-gram cache file at {path}; save one first or drop the option") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read n-gram cache file {path}: {exc}; delete it or point to another one") from None
    if not isinstance(data, dict) or data.get("version") != FILE_VERSION:
        raise ConfigError(f"{path} is not a version-{FILE_VERSION} n-gram cache file; delete it or point to another one")
    return data
