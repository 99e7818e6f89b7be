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

    def add(self, continuation: Sequence[int], source: str = "") -> None:
        parent = -1
        for depth, token in enumerate(continuation, start=1):
            node = self.children.get((parent, token))
            if node is None:
                node = len(self.tokens)
                self.tokens.append(int(token))
                self.parents.append(parent)
                self.depths.append(depth)
                self.children[(parent, token)] = node
                self.sources.append(source)
            parent = node

    def __len__(self) -> int:
        return len(self.tokens)

    def first_chain(self) -> CandidateTree:
        """The first continuation added (the best-ranked one: nodes 0..k-1, each the child of the one
        before) as a tree of its own. Exact steps at reduced precision verify only this chain: a node of
        another branch would see the first branch's keys as a masked gap (engine/query.py)."""
        k = 0
        while k < len(self.tokens) and self.parents[k] == k - 1:
            k += 1
        if k == len(self.tokens):
            return self
        chain = CandidateTree()
        for i in range(k):
            chain.tokens.append(self.tokens[i])
            chain.parents.append(i - 1)
            chain.depths.append(i + 1)
            chain.children[(i - 1, self.tokens[i])] = i
            chain.sources.append(self.sources[i])
        return chain

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
    tree: CandidateTree
    aux: AuxBranch | None = None


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
