"""Token recycling's candidate source (Luo et al. 2024, "Turning Trash into Treasure", arXiv 2408.08696).

Every row whose logits a step computes (prompt rows, verified rows, rows on rejected branches) also
says which tokens the model expects after that row's input token. The engine hands those over as
`Observation.successors` (input token, its top-k next tokens best first); this source keeps them in an
adjacency `token -> successors` and guesses the tokens after the root by walking it. The guesses cost
no extra query rows: they are recycled from logits the model computed anyway.

Adjacency. A dict, not the paper's dense vocab x k matrix: it holds one row per distinct input token
seen (bounded by the vocabulary, typically a few thousand rows), needs no vocabulary size, and costs
nothing at start. As in the paper the newest top-k for a token replaces its old row (within a step,
the last row for a token wins). Then the step's accepted succession (the root before the step, then
every accepted token) is applied: each token actually observed after x is moved to the front of x's
row (inserted when missing, the row cut back to top_k) and remembered as x's confirmed successor.
The adjacency lives in a `SuccessorTable` that the requests of one model and label share (the paper's
hot start: its matrix is inherited across queries), so a request's first steps already have successors
for tokens that earlier requests saw. A row this request has not written itself is *inherited*: it
comes from another context, so guesses that start from one are calibrated apart (feature + 10).
Measured on held-out workload requests (SmolLM2-135M bf16, 12 per class, interleaved, shared table
against one per request): tokens per step +12% on math, +5% code, +1% function calling, -0.3% chat,
-0.7% summarization; paired speed 1.00x-1.13x.

Second order. A token's row says what followed it last time, whatever came before it, so a walk from
one row to the next loops on short cycles ("clean_clean_clean" after "_" was once followed by "clean").
The table also keeps rows keyed by the tokens before the token (`contexts`: (previous, token) at order
2, also (two before, previous, token) at order 3), written from the rows whose preceding tokens on
their own path the step reports (`Observation.predecessors`: for the root the context before it, for a
node its ancestors and the root) and promoted by accepted successions like the token rows. The walk
takes, at each node, the row keyed by the most preceding tokens the table has, else the token's row.
Keyed rows are bounded (`max_contexts`, least recently written dropped first; 0: first order only).
Measured on 50 held-out workload requests (SmolLM2-135M bf16, prompts 60-69 per class, a fixed cost
curve, tables shared per class, interleaved), tokens per step against first order: order 2 chat +0.6%,
code +3.7%, function calling +2.4%, math +10.4%, summarization +1.2% (paired speed 1.00x-1.08x);
order 3 against order 2: -0.6%, +0.7%, -1.8%, +3.0%, -1.8%, so the default is order 2.

Candidates. A best-first tree from the root. The child of token x at rank r is x's successor at
rank r; a path's score is the product of a per-rank prior, geometric in rank:
prior(r) = first_prob * rank_decay**r (defaults 0.6, 0.4: 0.6, 0.24, 0.096, ...). The numbers only
order the expansion (how deep before how wide); calibrated acceptance rates come from the engine's
calibrator, keyed by each candidate's `feature`. The greedy chain (rank 0 at every depth, up to
max_tokens) is always taken whole and emitted first, since the engine may verify only the first
candidate. The remaining node budget (min(limit * max_tokens, max_nodes) nodes in all) goes to the
best-scoring frontier nodes; with the "next sibling / first child" rule each popped node pushes at
most two entries, and the order is still exactly best-first because scores fall with rank and depth.
A node that would start a new leaf is dropped once there are `limit` leaves. The root-to-leaf paths
are emitted in the order their branches were created (so best branch point first), each at most
max_tokens long; they are distinct leaves of one tree, so none is a prefix of another. Paths may
repeat tokens (a -> b -> a -> b): depth is bounded by max_tokens, so cycles cannot loop.

Sampling. A row's best-first order is the greedy guess; under seeded sampling the token at position t is
argmax(logits / temperature + noise_t), and noise_t is the rule's own, known before the step
(engine/sampling.py), so each row is ordered by that score instead, over the logits the step recycled
with it (`Observation.logits`; the newest row this request wrote for the token), the tokens past the
sampling's top-k or top-p last. Measured before building it (SmolLM2-135M bf16, 8 HellaSwag prompts at
temperature 1.0, teacher-forced): a token's recycled row put the drawn token first 4.8% of the time, the
noise's order 9.4%; in the engine (20 high-entropy requests, interleaved, identical outputs) recycled
tokens 152 -> 291, tokens per step 1.100 -> 1.159, paired speed +4.7%; 20 chat requests at temperature
0.7, top-p 0.9: tokens per step 1.668 -> 1.692, +1.5% (docs/measurements.md, "Measured: sampled
requests guess what the seeded rule will draw").

Feature (< 60): rank of the path's first token under the root (0, 1, 2, 3; 4 for rank >= 4), plus 5
when that token is the root's confirmed successor (it was actually seen to follow the root), plus 10
when the root's row is inherited from another request, plus 20 for each preceding token that keys
the root's row (20 at order 2, 40 at order 3).

Cost (pure Python, CPython 3.11, best of 5 timeit runs on a shared 2-core machine, adjacency of
5,000 random rows, top_k 8): observe with 10 successor rows and 3 accepted tokens ~6 us; candidates
with limit 8, max_tokens 7 (56-node budget) ~63 us, limit 16 x 8 (64 nodes) ~86 us, limit 4 x 5
~24 us, greedy chain only (limit 1, 7 tokens) ~5 us.
Keyed rows (order 2) add ~30 us a step: candidates over 300 rows, 313 keyed, limit 8 x 7 tokens,
82 us -> 109 us; observe with 10 rows and 3 accepted tokens 7 us -> 13 us (same machine, 2026-12-02).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from heapq import heappop, heappush
from typing import Any

from lookahead.candidates.confidence import ModelConfidence
from lookahead.engine.sampling import TokenChooser
from lookahead.engine.sources import HISTORY, Candidate, Observation

_RANK_BUCKETS = 5  # first-token rank 0..3, and 4 for 4+
_CONFIRMED = 5  # added to the feature when the first token is the root's confirmed successor
_INHERITED = 10  # added when the root's row was written by another request (a shared table)
_ORDER = 20  # times (order - 1) of the root's row: added when it is a row keyed by preceding tokens too


class SuccessorTable:
    """token -> the model's top-k next tokens after it, best first (`adj`), and the token last seen to
    follow it (`confirmed`); (preceding tokens..., token) -> the same after those tokens (`contexts`,
    keyed by the last 1 .. order - 1 tokens before the token). One table may serve many requests in turn
    (`engine/shared.py`); it holds at most one `adj` row per vocabulary entry and `max_contexts` keyed
    rows (the least recently written dropped first; each ~300 bytes)."""

    def __init__(self, top_k: int = 8, order: int = 2, max_contexts: int = 65536) -> None:
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        if not 1 <= order <= HISTORY + 1:
            raise ValueError(f"order must be 1 (a row per token) .. {HISTORY + 1}, got {order}")
        if max_contexts < 0:
            raise ValueError(f"max_contexts must be >= 0, got {max_contexts}")
        self.top_k = top_k
        self.order = order if max_contexts else 1
        self.max_contexts = max_contexts
        self.adj: dict[int, tuple[int, ...]] = {}
        self.confirmed: dict[int, int] = {}
        self.contexts: OrderedDict[tuple[int, ...], tuple[int, ...]] = OrderedDict()
        # how sure the model was of each row's tokens, shared with the table (candidates/confidence.py; fed
        # and read by the candidate pool; not kept in learned-state files: a few steps rebuild it)
        self.confidence = ModelConfidence()

    def write(self, before: Sequence[int], token: int, row: tuple[int, ...]) -> None:
        """The successors of `token` after the tokens `before` (oldest first): the newest row wins, for
        each key of 1 .. order - 1 preceding tokens that `before` has."""
        for k in range(1, min(self.order - 1, len(before)) + 1):
            self.write_key((*before[-k:], token), row)

    def write_key(self, key: tuple[int, ...], row: tuple[int, ...]) -> None:
        """The row for `key` (preceding tokens, then the token), now the most recently written."""
        contexts = self.contexts
        if key in contexts:
            contexts.move_to_end(key)
        contexts[key] = row
        if len(contexts) > self.max_contexts:
            contexts.popitem(last=False)

    def row(self, before: Sequence[int], token: int) -> tuple[tuple[int, ...] | None, int]:
        """What follows `token` after the tokens `before`, and the order of the row that says it: the row
        keyed by the most preceding tokens the table has (order 2, 3), else the token's (1)."""
        for k in range(min(self.order - 1, len(before)), 0, -1):
            row = self.contexts.get((*before[-k:], token))
            if row:
                return row, k + 1
        return self.adj.get(token), 1

    def __len__(self) -> int:
        return len(self.adj)

    # -- files (lookahead/learned.py) -----------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """Rows as JSON-ready lists; keyed rows least recently written first. Safe beside a request that
        writes the table in another thread (it reads copies: one C-level copy each, atomic under the GIL)."""
        adj, confirmed, contexts = dict(self.adj), dict(self.confirmed), OrderedDict(self.contexts)
        return {"top_k": self.top_k, "order": self.order, "max_contexts": self.max_contexts,
                "adj": [[t, list(row)] for t, row in adj.items()],
                "confirmed": [[t, n] for t, n in confirmed.items()],
                "contexts": [[list(key), list(row)] for key, row in contexts.items()]}

    @classmethod
    def from_json(cls, data: Any, vocab: int | None = None, into: SuccessorTable | None = None) -> SuccessorTable:
        """The rows `to_json` wrote, in `into` (an empty table; None: one of the default settings): the
        settings are today's, not the file's, as the calibrator takes its configuration; rows are cut to
        its top_k and keyed rows beyond its order left out. `vocab`: refuse token ids outside
        0 .. vocab-1. Raises ValueError/TypeError/KeyError otherwise."""
        out = into if into is not None else cls()
        top_k = out.top_k
        hi = vocab if vocab is not None else float("inf")
        longest = data["top_k"]  # rows as long as the file's table kept them
        if type(longest) is not int or longest < 1:
            raise ValueError(f"top_k must be an integer >= 1, got {longest!r}")

        def ids(xs: Any, least: int, most: int) -> tuple[int, ...]:
            if not (least <= len(xs) <= most and all(type(t) is int and 0 <= t < hi for t in xs)):
                raise ValueError(f"bad token ids {xs!r} (want {least}..{most} ids below {hi})")
            return tuple(xs)

        for token, row in data["adj"]:
            out.adj[ids([token], 1, 1)[0]] = ids(row, 0, longest)[:top_k]
        for token, nxt in data["confirmed"]:
            out.confirmed[ids([token], 1, 1)[0]] = ids([nxt], 1, 1)[0]
        for key, row in data["contexts"]:
            key = ids(key, 2, HISTORY + 1)
            if len(key) <= out.order:
                out.write_key(key, ids(row, 0, longest)[:top_k])
        return out


class RecyclingSource:
    """Token recycling: guesses from the model's own top-k next tokens at earlier rows."""

    name: str = "recycle"

    def __init__(self, top_k: int = 8, max_nodes: int = 64, first_prob: float = 0.6, rank_decay: float = 0.4,
                 table: SuccessorTable | None = None, chooser: TokenChooser | None = None) -> None:
        if table is not None and table.top_k != top_k:
            raise ValueError(f"a table of top-{table.top_k} rows for a source of top_k {top_k}")
        if max_nodes < 1:
            raise ValueError(f"max_nodes must be >= 1, got {max_nodes}")
        if not (0.0 < first_prob <= 1.0 and 0.0 < rank_decay < 1.0):
            raise ValueError(f"need 0 < first_prob <= 1 and 0 < rank_decay < 1, got {first_prob}, {rank_decay}")
        self.table = table if table is not None else SuccessorTable(top_k)  # validates top_k
        self.top_k = top_k
        self.max_nodes = max_nodes
        self.prior: tuple[float, ...] = tuple(first_prob * rank_decay**r for r in range(top_k))
        self.adj = self.table.adj
        self.confirmed = self.table.confirmed
        self.own: set[int] = set()  # tokens whose row this request wrote (the others are inherited)
        # Sampling: the rule's noise (engine/sampling.py) orders each row (see `_drawn_first`); the logits
        # of the newest row this request wrote per token, successor -> logit (None: greedy, rank order)
        self.chooser = chooser if chooser is not None and not chooser.cfg.greedy else None
        self.logits: dict[int, dict[int, float]] = {}

    # -- learning -------------------------------------------------------------------------------
    def observe(self, obs: Observation) -> None:
        adj, k, table = self.adj, self.top_k, self.table
        before = obs.predecessors if len(obs.predecessors) == len(obs.successors) else [()] * len(obs.successors)
        if self.chooser is not None and len(obs.logits) == len(obs.successors):
            for (token, nxt), values in zip(obs.successors, obs.logits):
                self.logits[token] = dict(zip(nxt, values))
        for (token, nxt), prev in zip(obs.successors, before):
            if len(nxt) > k:
                nxt = nxt[:k]
            if len(set(nxt)) != len(nxt):  # never expected from a top-k, but duplicates would duplicate paths
                nxt = tuple(dict.fromkeys(nxt))
            adj[token] = nxt
            table.write(prev, token, nxt)
            self.own.add(token)
        accepted = obs.accepted
        if not accepted:
            return
        context = obs.context
        history = self.table.order - 1
        for i in range(max(len(context) - len(accepted) - 1, 0), len(context) - 1):  # context[i] -> context[i + 1]
            self._promote(context[max(i - history, 0) : i], context[i], context[i + 1])

    def _promote(self, before: Sequence[int], token: int, nxt: int) -> None:
        """`nxt` was seen to follow `token` (itself after `before`): put it first in token's row and in
        the rows keyed by its preceding tokens."""
        self.confirmed[token] = nxt
        self.own.add(token)
        row = self.adj.get(token, ())
        if not row or row[0] != nxt:
            self.adj[token] = self._to_front(row, nxt)
        table = self.table
        for k in range(1, min(table.order - 1, len(before)) + 1):
            key = (*before[-k:], token)
            table.write_key(key, self._to_front(table.contexts.get(key) or row, nxt))

    def _to_front(self, row: tuple[int, ...], nxt: int) -> tuple[int, ...]:
        """`row` with `nxt` first (moved, or inserted and the row cut back to top_k)."""
        return row if row and row[0] == nxt else ((nxt,) + tuple(t for t in row if t != nxt))[: self.top_k]

    # -- guessing -------------------------------------------------------------------------------
    def candidates(self, context: Sequence[int], max_tokens: int, limit: int) -> list[Candidate]:
        if not context or max_tokens <= 0 or limit <= 0:
            return []
        prior, row_of, history = self.prior, self.table.row, self.table.order - 1
        root = context[-1]
        before_root = tuple(context[-1 - history : -1]) if history else ()
        first_row, root_order = row_of(before_root, root)
        if not first_row:
            return []
        start = len(context)  # the absolute position of the first guessed token
        rows: dict[tuple[int, ...], tuple[int, ...] | None] = {}  # each path's row, looked up (sampling: ordered) once
        if self.chooser is not None:
            first_row = self._drawn_first(first_row, root, start)
        # Nodes: index -> (path from the root, score, leaf slot); node 0 is the root itself. A node's
        # row is its (parent's token, token) pair row where there is one, else its token's row.
        paths: list[tuple[int, ...]] = [()]
        scores: list[float] = [1.0]
        slot_of: list[int] = [-1]
        leaves: list[int] = []  # slot -> the node that is currently that leaf
        heap: list[tuple[float, int, int, int]] = []  # (-score, tie order, parent node, rank)
        order = 0

        def row_after(path: tuple[int, ...]) -> tuple[int, ...] | None:
            if not path:
                return first_row
            row = rows.get(path)
            if row is None:  # a node's row is read when it is expanded and again when its children are
                before = (*before_root, root, *path[:-1])
                row = row_of(before[-history:] if history else (), path[-1])[0]
                if self.chooser is not None and row:  # ordered for the position after the path
                    row = self._drawn_first(row, path[-1], start + len(path))
                rows[path] = row
            return row

        # The greedy chain, whole; each of its nodes' rank-1 siblings goes on the frontier.
        parent = 0
        row = first_row
        while row and len(paths) <= max_tokens:
            if len(row) > 1:
                heappush(heap, (-scores[parent] * prior[1], order, parent, 1))
                order += 1
            paths.append(paths[parent] + (row[0],))
            scores.append(scores[parent] * prior[0])
            slot_of.append(0)
            parent = len(paths) - 1
            row = row_after(paths[parent]) if len(paths) <= max_tokens else None
        leaves.append(parent)

        budget = max(len(paths) - 1, min(limit * max_tokens, self.max_nodes))
        while heap and len(paths) - 1 < budget:
            neg, _, parent, rank = heappop(heap)
            new_leaf = rank > 0 or parent == 0
            if new_leaf and len(leaves) >= limit:
                continue  # its later siblings would start new leaves too, so none is pushed
            row = row_after(paths[parent])
            assert row is not None  # pushed because it had a child at this rank
            token = row[rank]
            if rank + 1 < len(row):
                heappush(heap, (-scores[parent] * prior[rank + 1], order, parent, rank + 1))
                order += 1
            path = paths[parent] + (token,)
            node = len(paths)
            paths.append(path)
            scores.append(-neg)
            if new_leaf:
                slot_of.append(len(leaves))
                leaves.append(node)
            else:
                slot = slot_of[parent]
                slot_of.append(slot)
                leaves[slot] = node
            if len(path) < max_tokens and row_after(path):
                heappush(heap, (neg * prior[0], order, node, 0))
                order += 1

        confirmed = self.confirmed.get(root)
        inherited = _INHERITED if root not in self.own else 0
        out: list[Candidate] = []
        for node in leaves:
            path = paths[node]
            rank = first_row.index(path[0])
            feature = min(rank, _RANK_BUCKETS - 1) + (_CONFIRMED if path[0] == confirmed else 0) + inherited \
                + _ORDER * (root_order - 1)
            out.append(Candidate(tokens=path, source=self.name, feature=feature))
        return out

    def _drawn_first(self, row: tuple[int, ...], token: int, position: int) -> tuple[int, ...]:
        """`row` (the successors of `token`) reordered by what the sampling rule would pick at `position`:
        argmax(logit / temperature + noise) where the noise is the rule's own for that position (a pure
        function of the seed and the position, engine/sampling.py), over the logits of the newest row this
        request wrote for `token` (a successor without one takes the row's lowest). Tokens past the
        sampling's top-k, or past its top-p within the row, go last. Rows with no logits keep their order."""
        known = self.logits.get(token)
        if not known or self.chooser is None:
            return row
        cfg = self.chooser.cfg
        low = min(known.values())
        logits = [known.get(t, low) / cfg.temperature for t in row]
        noise = self.chooser.noise_at(position, row)
        by_logit = sorted(range(len(row)), key=lambda j: -logits[j])
        outside: set[int] = set(by_logit[cfg.top_k:]) if cfg.top_k else set()
        if cfg.top_p < 1.0:  # the row's own share of probability: a nucleus over these tokens only
            top = logits[by_logit[0]]
            weights = [math.exp(logits[j] - top) for j in by_logit]
            total, mass = sum(weights), 0.0
            for j, w in zip(by_logit, weights):
                if mass >= cfg.top_p * total:
                    outside.add(j)
                mass += w
        order = sorted(range(len(row)), key=lambda j: (j in outside, -(logits[j] + noise[j])))
        return tuple(row[j] for j in order)
