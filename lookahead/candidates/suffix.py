"""Suffix-match candidate source (after SuffixDecoding, arXiv 2411.04975, and SAM-Decoding, arXiv 2411.10666).

The text T (prompt, then every accepted token; its last token is the root) is indexed as it grows.
Each step looks for the LONGEST suffix of T, at most `max_match` tokens, that also ends at an earlier
position p <= len(T) - 2 (so at least one token followed it; the suffix matching itself at the very
end does not count), and guesses what came after those earlier occurrences.

Index. Two incremental structures, both O(1) amortised per token and linear in memory:
  * a suffix automaton over T. Adding a token already computes the length of the longest suffix
    that occurred before (len(p) + 1 for the state p whose transition is found, 0 when none is),
    so the exact match length L costs nothing at query time. Hashed n-grams alone would give L only
    up to the nearest indexed length, or by scanning every occurrence; the automaton (at most
    2 len(T) states) does not say *where* the matches are, which is why we also keep
  * position lists for n-grams of lengths 1, 2, 4, 8, ... <= max_match (tuple key -> end positions,
    oldest first). The occurrences of the L-token suffix all lie in the list of the largest indexed
    length k <= L, and each of them matches at least k >= L/2 tokens, so a short scan from the
    newest end, checking the remaining tokens with one list-slice comparison, finds them.
The source assumes the context only grows (observe() and candidates() index whatever is new); a
context that does not extend the indexed text (another request) rebuilds the index from scratch.

Candidates. Level 0 holds the newest `max_occurrences` earlier positions whose match is L (capped
at max_match). Their continuations T[p+1 : p+1+max_tokens] (cut at the end of T; identical ones
merged with a count) form a trie whose node counts are the occurrences through the node; a path's
score is the product of child count / parent count, i.e. (count of its last node) / (occurrences in
the level). The trie is walked lazily, best first: the first path follows the most frequent child
from the root down to a leaf; every child not taken goes on a heap keyed by its count, and the next
path is the best heap entry extended the same way. Ties (equal counts) go to the child seen most
recently. Every path ends at a leaf of the trie (or at depth max_tokens), so no path is a prefix of
another. If fewer than `limit` paths came out, shorter matches add candidates: level k (k = the
indexed lengths below L, longest first) holds the newest positions whose match is at least k but
shorter than the previous level's length, and only paths whose first token is new are kept (so no
prefix relations arise between levels). These levels together use at most fallback_occurrences
positions, and none when level 0 already used all max_occurrences. At most `max_scan` list entries
are looked at per call.

Feature (0..29) = 3 * length bucket + share bucket, + 15 where the path follows the nearest occurrence.
Length bucket of the level's match length (L at level 0, k at level k): 1 -> 0, 2 -> 1, 3-4 -> 2, 5-8 ->
3, 9+ -> 4. Share bucket of the path's first token, count / occurrences in the level: >= 0.8 -> 0, >= 0.5
-> 1, else 2. Nearest occurrence (after PLD+, arXiv 2412.01447, which ranks prompt-lookup occurrences by
the model's hidden states): the engine reports the model's final hidden state at every cached position
(engine/sources.WantsStates; candidates/states.py); of level 0's occurrences, ending at p, the nearest is
the one whose state at p - 1 (the row that chose T[p]) has the largest cosine with the state at n - 2
(the row that chose the root). A path that follows its continuation is flagged. Teacher-forced over 160
greedy answers of SmolLM2-135M-Instruct (bfloat16), the first token of a path in the same length and
share bucket was right far more often when flagged: after a 2-token match with share >= 0.8, 0.60
against 0.15 (code), 0.70 / 0.48 (function calling), 0.57 / 0.34 (chat); after 3-4 tokens, 0.71 / 0.38,
0.67 / 0.53, 0.69 / 0.43; after 9+ tokens nearly every guess follows it (docs/results/similar-states/).
In the engine the calibrator learned the split (20 code requests, after a 2-token match: 0.19 unflagged
against 0.56 flagged at share >= 0.8, 0.05 against 0.45 at 0.5-0.8), but paired on held-out requests
the steps were no faster (1.001x and 1.002x; tokens per step +1% on average, rows up about as much), so
it is off by default (`states=False`; LookaheadConfig.hidden_states).
Without states (off, or a model whose final norm the runner does not know) no path is flagged.

Cost (pure Python, CPython 3.11, timeit best of 5 per call on a shared 2-core machine under load
~3, defaults, 4,000-token context then 600 more steps): observe of one accepted token 4-7 us;
candidates(max_tokens=7, limit=8) mean / p95: 55 / 120 us on code split into word tokens, 70 / 105 us
on a 4-token random vocabulary (matches of ~6, three levels), 21 / 40 us on a 1,000-token random
vocabulary, 47 / 75 us on one repeated token (64 occurrences); with limit=1, 15-47 us. Memory about
1.7 kB per indexed token (automaton dicts, n-gram tuple keys and position lists), e.g. 7 MB at 4,000.
"""

from __future__ import annotations

from collections.abc import Sequence
from heapq import heappop, heappush

import torch

from lookahead.candidates.growing import GrowingText
from lookahead.candidates.states import HiddenStates
from lookahead.engine.sources import Candidate, Observation


def feature_of(match_len: int, share: float, nearest: bool = False) -> int:
    """The candidate's confidence bucket: 3 * length bucket + share bucket, + 15 when the path follows the
    occurrence in the nearest state (see module doc)."""
    length_bucket = (0, 0, 1, 2, 2)[max(match_len, 0)] if match_len <= 4 else 3 if match_len <= 8 else 4
    share_bucket = 0 if share >= 0.8 else 1 if share >= 0.5 else 2
    return 3 * length_bucket + share_bucket + (15 if nearest else 0)


class SuffixSource(GrowingText):
    """Guesses from what followed the longest earlier match of the context's suffix."""

    name: str = "suffix"

    def __init__(self, prompt: Sequence[int], max_match: int = 32, max_occurrences: int = 64,
                 fallback_occurrences: int = 16, max_scan: int = 256, states: bool = False) -> None:
        if max_match < 1 or max_occurrences < 1 or fallback_occurrences < 0 or max_scan < 1:
            raise ValueError(f"max_match, max_occurrences, max_scan must be >= 1 and fallback_occurrences >= 0, "
                             f"got {max_match}, {max_occurrences}, {max_scan}, {fallback_occurrences}")
        self.max_match = max_match
        self.max_occurrences = max_occurrences
        self.fallback_occurrences = fallback_occurrences
        self.max_scan = max_scan
        self._keys: list[int] = [1 << i for i in range(max_match.bit_length()) if 1 << i <= max_match]
        self.states = states  # the engine reports final hidden states to this source (engine/sources.WantsStates)
        self._hidden = HiddenStates()
        self._reset()
        self._sync(prompt)

    def _reset(self) -> None:
        self._hidden.clear()  # another text: its states are not this one's
        self._tokens: list[int] = []
        self._next: list[dict[int, int]] = [{}]  # suffix automaton: transitions, link, longest length
        self._link: list[int] = [-1]
        self._len: list[int] = [0]
        self._last = 0
        self._match = 0  # longest earlier match of the current suffix (uncapped)
        self._occ: dict[tuple[int, ...], list[int]] = {}
        self._cur: list[list[int]] = []  # position lists of the current suffix, one per indexed length

    def _extend(self, c: int) -> None:
        nxt, link, ln = self._next, self._link, self._len
        cur = len(ln)
        nxt.append({})
        link.append(0)
        ln.append(ln[self._last] + 1)
        p = self._last
        while p != -1 and c not in nxt[p]:
            nxt[p][c] = cur
            p = link[p]
        if p == -1:
            self._match = 0
        else:
            q = nxt[p][c]
            self._match = ln[p] + 1
            if ln[q] == ln[p] + 1:
                link[cur] = q
            else:  # split q: the clone takes the shorter strings, which now also end here
                clone = len(ln)
                nxt.append(dict(nxt[q]))
                link.append(link[q])
                ln.append(ln[p] + 1)
                while p != -1 and nxt[p].get(c) == q:
                    nxt[p][c] = clone
                    p = link[p]
                link[q] = clone
                link[cur] = clone
        self._last = cur
        tokens = self._tokens
        tokens.append(c)
        n = len(tokens)
        self._cur = []
        for k in self._keys:
            if k > n:
                break
            positions = self._occ.setdefault(tuple(tokens[n - k:]), [])
            positions.append(n - 1)
            self._cur.append(positions)

    def observe(self, obs: Observation) -> None:
        self._sync(obs.context)

    def observe_states(self, start: int, states: torch.Tensor) -> None:
        """The model's final hidden states at text positions start.. (engine/sources.WantsStates)."""
        if self.states:
            self._hidden.observe(start, states)

    def candidates(self, context: Sequence[int], max_tokens: int, limit: int) -> list[Candidate]:
        self._sync(context)
        match = min(self._match, self.max_match)
        if max_tokens < 1 or limit < 1 or match == 0:
            return []
        ki = max(i for i, k in enumerate(self._keys) if k <= match)
        # Levels: (its match length, the shortest match length it excludes: None for level 0, key index).
        levels: list[tuple[int, int | None, int]] = [(match, None, ki)]
        prev = match
        for i in range(ki, -1, -1):
            if self._keys[i] < prev:
                levels.append((self._keys[i], prev, i))
                prev = self._keys[i]
        out: list[Candidate] = []
        firsts: set[int] = set()
        budget, scans = self.max_occurrences, self.max_scan
        for length, excluded, i in levels:
            if len(out) >= limit or budget <= 0 or scans <= 0:
                break
            found, scanned = self._find(length, excluded, i, budget, scans)
            scans -= scanned
            budget -= len(found)
            if excluded is None:  # the shorter levels share what level 0 left, at most fallback_occurrences
                budget = min(budget, self.fallback_occurrences)
            if not found:
                continue
            near: tuple[int, ...] = ()  # level 0: the continuation of the occurrence in the nearest state
            if excluded is None and self.states:
                before = self._hidden.nearest(len(self._tokens) - 2, [p - 1 for p in found])
                if before is not None:
                    near = tuple(self._tokens[before + 2:before + 2 + max_tokens])
            for path, first_count in self._paths(found, max_tokens, limit - len(out), firsts):
                follows = bool(near) and path == near[:len(path)]
                out.append(Candidate(path, self.name, feature_of(length, first_count / len(found), follows)))
                firsts.add(path[0])
        return out

    def occurrences(self) -> tuple[int, list[int]]:
        """The longest earlier match of the indexed text's suffix: its length (at most max_match; 0: none)
        and the newest end positions of it (level 0 of `candidates`), newest first."""
        match = min(self._match, self.max_match)
        if match == 0:
            return 0, []
        ki = max(i for i, k in enumerate(self._keys) if k <= match)
        return match, self._find(match, None, ki, self.max_occurrences, self.max_scan)[0]

    def _find(self, length: int, excluded: int | None, i: int, budget: int, scans: int) -> tuple[list[int], int]:
        """One level's end positions, newest first, at most `budget` of them from at most `scans` entries of
        the list of indexed length self._keys[i]: those whose match is `length` (level 0, `excluded`
        None) or at least `length` but shorter than `excluded`. Returns them and the entries looked at."""
        tokens, n = self._tokens, len(self._tokens)
        # Level 0 checks the full match unless L is an indexed length; lower levels check the exclusion.
        check = excluded if excluded is not None else length if length > self._keys[i] else None
        positions = self._cur[i]  # oldest first; the last entry is the end itself
        window = positions[max(0, len(positions) - 1 - scans):-1][::-1]
        if check is None:
            found = window[:budget]
            return found, len(found)
        suffix = tokens[n - check:]
        found, keep, j = [], excluded is None, -1  # level 0 keeps full matches, lower levels drop them
        for j, p in enumerate(window):
            if (p + 1 >= check and tokens[p + 1 - check:p + 1] == suffix) is keep:
                found.append(p)
                if len(found) == budget:
                    break
        return found, j + 1

    def _paths(self, occ: list[int], max_tokens: int, room: int,
               banned: set[int]) -> list[tuple[tuple[int, ...], int]]:
        """Best-first root-to-leaf paths of the continuation trie of `occ` (positions, newest first),
        at most `room` of them, none starting with a banned token; each with its first node's count.
        The trie is kept implicit: a node is (depth, the distinct continuations through it)."""
        tokens = self._tokens
        seen: dict[tuple[int, ...], list[int]] = {}  # continuation -> [count, newest position]
        for p in occ:
            cont = tuple(tokens[p + 1:p + 1 + max_tokens])
            entry = seen.get(cont)
            if entry is None:
                if cont[0] not in banned:
                    seen[cont] = [1, p]
            else:
                entry[0] += 1
        items = [(cont, c, p) for cont, (c, p) in seen.items()]  # newest first
        heap: list[tuple[int, int, int, int, list[tuple[tuple[int, ...], int, int]], int]] = []
        out: list[tuple[tuple[int, ...], int]] = []
        start: tuple[int, list[tuple[tuple[int, ...], int, int]], int] | None = (0, items, 0) if items else None
        seq = 0
        while start is not None:
            depth, group, first_count = start
            while depth < max_tokens and len(group) > 1:
                children: dict[int, list[tuple[tuple[int, ...], int, int]]] = {}
                weight: dict[int, int] = {}
                for item in group:
                    try:
                        t = item[0][depth]
                    except IndexError:  # this continuation ends here (it ran into the end of the text)
                        continue
                    if t in children:
                        children[t].append(item)
                        weight[t] += item[1]
                    else:
                        children[t] = [item]
                        weight[t] = item[1]
                if not children:
                    break
                best = max(weight, key=weight.__getitem__)  # first maximum: the most recent
                for t, g in children.items():
                    if t != best:
                        seq += 1
                        heappush(heap, (-weight[t], -g[0][2], seq, depth + 1, g, first_count or weight[t]))
                if depth == 0:
                    first_count = weight[best]
                group = children[best]
                depth += 1
            if len(group) == 1:  # one distinct continuation left: it is the leaf
                depth = len(group[0][0])
                first_count = first_count or group[0][1]
            out.append((group[0][0][:depth], first_count))
            start = None
            if heap and len(out) < room:
                start = heappop(heap)[3:]
        return out
