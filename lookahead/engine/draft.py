"""What a candidate source hands the shared step routine, and what it gets back.

A step's query is the last accepted token (the root) plus two optional parts:
- a candidate tree: guesses for the tokens after the root, merged into a trie so that shared prefixes
  are computed once; verified against the model's own choices in the same forward pass;
- an auxiliary branch: tokens whose outputs the source wants (the Jacobi window of lookahead
  decoding). Their keys are never kept in the cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable

import torch


@dataclass(frozen=True)
class AuxBranch:
    """tokens[A]; offsets[A] position relative to the root (>= 1); visible[A, A] bool among aux tokens
    (every aux token also sees the prefix and the root); `out_rows` (ascending) are the aux rows whose
    predictions the source wants back."""

    tokens: torch.Tensor
    offsets: torch.Tensor
    visible: torch.Tensor
    out_rows: torch.Tensor


@dataclass
class CandidateTree:
    """A trie of guessed continuations of the root. Node i has token tokens[i] and parent parents[i]
    (-1 is the root); parents always come before children."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    children: dict[tuple[int, int], int] = field(default_factory=dict)  # (parent, token) -> node
    sources: list[str] = field(default_factory=list)  # which source minted each node
    probs: list[float] = field(default_factory=list)  # calibrated P(node's whole path accepted)

    def add(self, continuation: Sequence[int], source: str = "", probs: Sequence[float] | None = None) -> None:
        """Merge a continuation in. `probs[d]`: the probability that its first d+1 tokens are accepted
        (engine/calibration.py); a node reached by several continuations keeps the highest (and the
        source of that one). Without probs, nodes get 1.0: verified as proposed."""
        parent = -1
        for depth, token in enumerate(continuation, start=1):
            p = 1.0 if probs is None else float(probs[depth - 1])
            node = self.children.get((parent, token))
            if node is None:
                node = len(self.tokens)
                self.tokens.append(int(token))
                self.parents.append(parent)
                self.depths.append(depth)
                self.children[(parent, token)] = node
                self.sources.append(source)
                self.probs.append(p)
            elif p > self.probs[node]:
                self.probs[node] = p
                self.sources[node] = source
            parent = node

    def subtree(self, nodes: Sequence[int]) -> CandidateTree:
        """The tree of `nodes` only (each one's parent must be in it, or be the root, and come first)."""
        out = CandidateTree()
        new_id: dict[int, int] = {-1: -1}
        for old in nodes:
            parent = new_id[self.parents[old]]  # KeyError: a node whose parent was left out
            new_id[old] = len(out.tokens)
            out.tokens.append(self.tokens[old])
            out.parents.append(parent)
            out.depths.append(self.depths[old])
            out.children[(parent, self.tokens[old])] = new_id[old]
            out.sources.append(self.sources[old])
            out.probs.append(self.probs[old])
        return out

    def __len__(self) -> int:
        return len(self.tokens)

    def cap_siblings(self) -> None:
        """Make the children of every node coherent with it: they are disjoint events (at most one of them
        is the next token), so their path probabilities may sum to at most their parent's. Children are
        taken likeliest first and each is capped at what its elder siblings leave of the parent's; a
        capped child's subtree is scaled by the same factor. First tokens (children of the root) are
        left alone: the pool corrects them by learned factors (candidates/pool.py)."""
        factor = [1.0] * len(self.tokens)
        left: dict[int, float] = {}  # parent -> probability its visited children leave over
        for node in sorted(range(len(self.tokens)), key=lambda n: (self.depths[n], -self.probs[n], n)):
            parent = self.parents[node]
            if parent < 0:
                continue
            scaled = self.probs[node] * factor[parent]  # the parent's subtree may have been scaled already
            room = left.get(parent, self.probs[parent])
            capped = min(scaled, room)
            factor[node] = capped / self.probs[node] if self.probs[node] > 0 else factor[parent]
            left[parent] = room - capped
            self.probs[node] = capped

    def first_chain(self) -> CandidateTree:
        """The first continuation added (the best-ranked one: nodes 0..k-1, each the child of the one
        before) as a tree of its own. Exact steps at reduced precision verify only this chain: a node of
        another branch would see the first branch's keys as a masked gap (engine/query.py)."""
        k = 0
        while k < len(self.tokens) and self.parents[k] == k - 1:
            k += 1
        return self if k == len(self.tokens) else self.subtree(range(k))

    def ancestors_matrix(self) -> torch.Tensor:
        """[T, T] bool: entry (i, j) is True when node j is node i or one of its ancestors."""
        t = len(self.tokens)
        rows: list[int] = []
        cols: list[int] = []
        for i in range(t):
            j = i
            while j >= 0:
                rows.append(i)
                cols.append(j)
                j = self.parents[j]
        m = torch.zeros(t, t, dtype=torch.bool)
        if t:
            m[rows, cols] = True
        return m


@dataclass
class Draft:
    """A step's proposal. `aux_value`: the tokens the aux branch is expected to earn (later steps'
    accepted guesses it mints), for the allocator (engine/allocator.py); `calibrated`: tree.probs are
    calibrated probabilities the allocator may size the step by (False: verify as proposed)."""

    tree: CandidateTree
    aux: AuxBranch | None = None
    aux_value: float = 0.0
    calibrated: bool = False


@dataclass(frozen=True)
class StepOutcome:
    """accepted: the tokens this step decided, in order: matched candidate tokens, then the model's own
    next token (so len >= 1). accepted_sources[i] names the source of accepted[i] ("model" for the last).
    aux_out: the model's choices at the aux out_rows (empty if no aux branch)."""

    accepted: list[int]
    accepted_sources: list[str]
    aux_out: list[int]
    query_tokens: int
    candidate_tokens: int
    successors: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)  # see sources.Observation
    predecessors: list[tuple[int, ...]] = field(default_factory=list)  # see sources.Observation
    successor_logits: list[tuple[float, ...]] = field(default_factory=list)  # see sources.Observation.logits
    forward_s: float = 0.0  # seconds inside the forward pass
    states: torch.Tensor | None = None  # [len(accepted), D]: final hidden states of the root and matched nodes


class Proposer(Protocol):
    """A candidate source. `context` is every token so far (prompt + generated); its last is the root."""

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        """Guesses for the next tokens; no candidate longer than `budget` tokens."""
        ...

    def update(self, context: Sequence[int], outcome: StepOutcome) -> None:
        """Learn from the step (context already includes the accepted tokens)."""
        ...


@runtime_checkable
class ReportsDraftCost(Protocol):
    """A candidate source that runs a model of its own (a draft) reports that compute: it is part of
    the cost of the strategy (GenerationStats.draft_steps/draft_s, included in device_s)."""

    def draft_cost(self) -> tuple[int, float]:
        """(forward passes, seconds inside them) since the source was created."""
        ...
