"""The interface every free candidate source implements, and what it learns from.

A source looks at the context (prompt + generated text; its last token is the step's root) and offers
guesses for the tokens after the root. It never decides how many are verified: the engine calibrates
each guess (engine/calibration.py) into a probability that its whole path is accepted, merges every
source's guesses into one tree, and the allocator (engine/allocator.py) picks the subtree worth its
cost on this device. After the step every source sees what happened (an `Observation`) and may learn.

Sources live in lookahead/candidates/ and are named in one registry (candidates/registry.py); the
engine never imports them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from lookahead.engine.draft import AuxBranch


@dataclass(frozen=True)
class Candidate:
    """Guessed tokens after the root, in order. `feature`: the source's own confidence bucket (for
    example its match length, or its rank in the source's list); the calibration is kept per
    (source, feature, depth), so a feature should be a small integer whose buckets differ in how
    often they are right."""

    tokens: tuple[int, ...]
    source: str
    feature: int = 0


HISTORY = 2  # tokens before a row's input token that the engine reports with its successors (Observation)


@dataclass(frozen=True)
class Observation:
    """What one step showed. `context`: every token so far, the step's accepted tokens included;
    `accepted`: the tokens this step appended; `aux_out`: the model's tokens at the aux branch's out
    rows (empty when no aux branch ran); `successors`: for every row whose logits the step computed,
    (the row's input token, the model's top-k next tokens at that row, best first). Rows on rejected
    branches are included: their predictions are still the model's, just for another prefix.
    `predecessors` (empty, or one per successors row): the tokens before that row's input token on the
    row's own path, oldest first (for a tree node: the tokens before the root, the root, its ancestors),
    at most HISTORY; empty for rows on no path (aux rows). `logits` (empty, or one per successors row):
    the model's logits of those top-k tokens, in the same order (how sure the model was of each:
    candidates/confidence.py; under sampling they also order recycled rows by the seeded rule)."""

    context: Sequence[int]
    accepted: Sequence[int]
    aux_out: Sequence[int] = ()
    successors: Sequence[tuple[int, tuple[int, ...]]] = ()
    predecessors: Sequence[tuple[int, ...]] = ()
    logits: Sequence[tuple[float, ...]] = ()


@runtime_checkable
class CandidateSource(Protocol):
    """A free source of candidates. `name` is its registry name (and the `source` of its candidates)."""

    name: str

    def candidates(self, context: Sequence[int], max_tokens: int, limit: int) -> list[Candidate]:
        """Up to `limit` guesses of at most `max_tokens` tokens each, best first, no duplicates."""
        ...

    def observe(self, obs: Observation) -> None:
        """Learn from a step."""
        ...


@runtime_checkable
class RunsAuxBranch(Protocol):
    """A source that needs rows of its own in the step (the Jacobi window): `branch` gives them,
    `observe` later gets their outputs in `Observation.aux_out`."""

    def branch(self) -> AuxBranch:
        ...


@runtime_checkable
class WantsSuccessors(Protocol):
    """A source that learns from the model's top-k next tokens at every computed row: the step
    computes `top_k` of them per row only when some source asks."""

    top_k: int


@runtime_checkable
class WantsStates(Protocol):
    """A source that compares the model's final hidden states (the LM head's input) at positions of the
    text: the engine reports them, when `states` is true, for every token it caches (the prompt's at the
    prefill, then each step's root and matched nodes), so position i's state is known once the text has
    grown past i + 1 (the last token, the next root, has none yet)."""

    states: bool

    def observe_states(self, start: int, states: torch.Tensor) -> None:
        """`states` [n, D]: the final hidden states at text positions start .. start + n - 1."""
        ...
