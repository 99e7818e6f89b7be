"""Prompt prefixes' keys and values, kept across requests on one model, so that a prompt that starts like
an earlier one prefills only the rest.

Requests of one kind of traffic often share their first hundreds of tokens: a system prompt, a tool
catalogue (BFCL's function-calling preamble is 254 of a median 510 tokens), a document asked about twice, a
conversation's earlier turns. The prefill of those tokens is compute-bound (SmolLM2 bf16 on 2 Zen 4 cores:
~0.47 s of a 1.6 s function-calling request), the same for every strategy, so it dilutes whatever decoding
saves. After a request's prefill, the cache keeps its prompt's keys and values in whole blocks of `block`
tokens; a later prompt with the same first blocks copies them into its slot and prefills from there on
(engine/model_runner.py `prefill(continued=True)`: the causal kernel after the copied keys).

Lossless, checked: a token's keys and values depend only on the tokens up to it (causal), so a stored
prefix is what the new prompt's own prefill would compute, provided the prefill's rows do not depend on
where the prompt is split into passes. On bfloat16 with lookahead's kernels they do not by construction
(engine/prefill_kernel.cpp: every row's sums run over the same absolute key chunks; linear_kernel.cpp:
each row alone), but other kernels may (PyTorch's SDPA, MKL's float32 linears). So `split_exact` checks it
on the device, once per model: a synthetic prompt prefilled whole and in three pieces, every layer's keys
and values compared bit for bit; where they differ, `usable` says no and nothing is reused (requests
prefill whole, as without the cache). Tests compare decoding with reused prefixes against decoding
without (tests/engine/test_prefix_cache.py).

Bounded: entries (a stored prompt's block-aligned tokens and their keys and values) are evicted least
recently used beyond `max_bytes`; an entry keeps its whole prefix (a shared system prompt is stored once
per entry that starts with it: simple, and cheap next to what a hit saves). What it keeps is users'
prompts as key/value tensors, in this process's memory only; `max_bytes=0` (server: --prefix-cache-mb 0)
turns it off, for instance where one tenant must not learn from another's response times that a prefix
was cached.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lookahead.config import is_int
from lookahead.engine.kvcache import KVCache
from lookahead.errors import ConfigError

BLOCK = 16  # tokens a reused prefix is a multiple of: whole 8-row tiles of the prefill kernel (prefill_kernel.cpp)
MAX_BYTES = 256 << 20  # default bound on the stored keys and values (SmolLM2-135M bf16: ~11,000 tokens)

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [H, n, D]


@dataclass
class _Entry:
    tokens: tuple[int, ...]  # a multiple of the block
    kv: KV
    nbytes: int
    keys: list[int]  # its blocks' chained hashes, one per block


class PrefixCache:
    """Stored prompt prefixes of one model, longest match first. Thread-safe (one lock per call). It
    belongs to the first model it is used with (`bind`): keys and values are the model's own."""

    def __init__(self, max_bytes: int = MAX_BYTES, block: int = BLOCK) -> None:
        if not is_int(max_bytes) or max_bytes < 0:
            raise ConfigError(f"the prefix cache's max_bytes must be an integer >= 0 (0: off), got {max_bytes!r}")
        if not is_int(block) or block < 8 or block % 8:
            raise ConfigError(f"the prefix cache's block must be a positive multiple of 8 tokens, got {block!r}")
        self.max_bytes, self.block = max_bytes, block
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # by id, least recently used first
        self._index: dict[int, tuple[int, int]] = {}  # chained hash of the first k blocks -> (entry id, k)
        self._next = 0
        self._lock = threading.Lock()
        self.bytes = 0
        self.hits = 0  # lookups that reused at least one block
        self.lookups = 0
        self.reused_tokens = 0
        self._owner: weakref.ref[Any] | None = None

    def bind(self, model: Any) -> None:
        """Use this cache for `model` only; refuses a second model (its keys and values would be another
        model's)."""
        with self._lock:
            owner = self._owner() if self._owner is not None else None
            if owner is None:
                self._owner = weakref.ref(model)
            elif owner is not model:
                raise ConfigError("this PrefixCache holds another model's keys and values; give each model its "
                                  "own (or pass prefix_cache=True for the model's shared one)")

    def _chain(self, tokens: Sequence[int], blocks: int) -> list[int]:
        """The chained hashes of tokens' first 1..blocks blocks (block k's hash covers blocks 0..k)."""
        out, h, b = [], 0, self.block
        for k in range(blocks):
            h = hash((h, tuple(tokens[k * b : (k + 1) * b])))
            out.append(h)
        return out

    def match(self, tokens: Sequence[int], least: int = 1) -> tuple[int, KV]:
        """The longest stored prefix of `tokens` (a multiple of the block) that leaves all of them or at
        least `least` after it (a pass of fewer rows would be padded: engine/model_runner.py): its length
        and its keys and values per layer (views of the stored tensors: copy before writing); (0, []) where
        none is."""
        if not self.max_bytes:
            return 0, []
        with self._lock:
            self.lookups += 1
            chain = self._chain(tokens, len(tokens) // self.block)
            for k in range(len(chain), 0, -1):
                n = k * self.block
                found = self._index.get(chain[k - 1])
                if found is None or 0 < len(tokens) - n < least:
                    continue
                entry = self._entries[found[0]]
                if entry.tokens[:n] != tuple(tokens[:n]):  # a hash collision
                    continue
                self._entries.move_to_end(found[0])
                self.hits += 1
                self.reused_tokens += n
                return n, [(key[:, :n], value[:, :n]) for key, value in entry.kv]
            return 0, []

    def store(self, tokens: Sequence[int], cache: KVCache, slot: int) -> None:
        """Keep the block-aligned part of `tokens`, whose keys and values slot `slot` of `cache` holds at
        positions 0.. (after a prefill), unless it is stored already or would not fit."""
        n = len(tokens) // self.block * self.block
        if not self.max_bytes or not n:
            return
        with self._lock:
            chain = self._chain(tokens, n // self.block)
            known = self._index.get(chain[-1])
            if known is not None and self._entries[known[0]].tokens[:n] == tuple(tokens[:n]):
                self._entries.move_to_end(known[0])  # the same prefix is stored: keep it, count the use
                return
        kv = cache.prefix(slot, n)  # the copy outside the lock
        nbytes = sum(t.numel() * t.element_size() for pair in kv for t in pair)
        if nbytes > self.max_bytes:
            return
        with self._lock:
            entry = _Entry(tuple(tokens[:n]), kv, nbytes, chain)
            eid, self._next = self._next, self._next + 1
            self._entries[eid] = entry
            for k, h in enumerate(chain, 1):
                self._index[h] = (eid, k)  # the newest entry answers for every prefix it holds
            self.bytes += nbytes
            while self.bytes > self.max_bytes:
                self._evict()

    def _evict(self) -> None:
        eid, entry = self._entries.popitem(last=False)
        self.bytes -= entry.nbytes
        for h in entry.keys:
            if self._index.get(h, (None, 0))[0] == eid:
                del self._index[h]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._index.clear()
            self.bytes = 0

    def stats(self) -> dict[str, int]:
        """entries, bytes, lookups, hits, reused_tokens (for metrics and reports)."""
        return {"entries": len(self._entries), "bytes": self.bytes, "lookups": self.lookups, "hits": self.hits,
                "reused_tokens": self.reused_tokens}


def split_exact(runner: Any, new_cache: Callable[[], KVCache], vocab: int, block: int = BLOCK,
                window: int | None = None) -> bool:
    """Does `runner` (an engine/model_runner.ModelRunner) prefill a prompt into caches from `new_cache` to
    the same bits whole and in pieces split at multiples of `block`? A synthetic prompt (seeded random
    tokens, past the model's longest sliding `window` where it has one) is prefilled whole, then in two
    and in three pieces, and every layer's keys and values are compared bit for bit."""
    n = (window or 0) + 5 * block + 3
    tokens = torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(0)).tolist()
    pieces = [[], [2 * block], [block, n - n % block - block]]
    results = []
    for cuts in pieces:
        cache = new_cache()
        cache.select(0, 1)
        start = 0
        for end in [*cuts, n]:
            runner.prefill(cache, tokens[start:end], continued=start > 0)
            start = end
        results.append(cache.prefix(0, n))
    whole = results[0]
    return all(torch.equal(a, b) for other in results[1:] for pa, pb in zip(whole, other) for a, b in zip(pa, pb))
