"""A request's realization: the share of its guesses' promised tokens that its steps actually delivered.

The calibrator (engine/calibration.py) prices each guess from what the requests of a class taught it, and
a whole tree's promise is the sum of its nodes' path probabilities. That overrates a tree where its
guesses are not independent (sources that copy the same passage), and a request whose text is unlike
what taught the calibrator (a fresh passage after copyable ones) gets promises its steps do not keep.
So the allocator sees every probability scaled by this request's ratio of accepted to promised extra
tokens (decayed sums, at most 1).

A ratio learned only from verified guesses can trap a request: a few early misses push it low, the
allocator then verifies nothing, and a step that verifies nothing says nothing about the guesses, so the
ratio never moves again however good the guesses become. Measured (SmolLM2-135M, bf16, prompts a-e then f
with shared calibration, as `benchmarks/bench_prompts.py` runs them): three of four runs of f fell to a
ratio of 0.08-0.13 within 15 steps and then verified nothing for the other ~100 tokens (1.0-1.13 tokens a
step), where the fourth settled near 0.7 and made 1.85 tokens a step.

So a step whose allocation the ratio emptied still learns: the scheduler names the nodes the allocator
would have verified at face value (`shadow`), and once the tokens after them exist they are scored as
verification would have scored them (`resolve`): the longest path of those nodes that the generated
tokens follow. That is exactly what the step would have accepted, greedy or sampled (a seeded draw at a
node is the token the model emits there either way; engine/sampling.py), and it enters the ratio like a
verified step's outcome. A request whose guesses stay wrong keeps a low ratio and pays nothing for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from lookahead.engine.draft import CandidateTree

PRIOR = 1.0  # pseudo-tokens promised and realized before any step (a ratio of 1)
DECAY = 0.9  # weight kept by older steps
MAX_SHADOWS = 32  # unverified steps awaiting their tokens (the oldest dropped beyond it)


class _Shadow(NamedTuple):
    position: int  # index in the context of the guesses' first token (the step's root is just before it)
    tree: CandidateTree
    nodes: frozenset[int]
    promised: float  # sum of the nodes' path probabilities
    end: int  # position + the deepest node's depth: scored once the context reaches it


def accepted_along(tree: CandidateTree, nodes: frozenset[int] | set[int], tokens: Sequence[int]) -> int:
    """How many of `tokens` (those after the step's root) verifying `nodes` of `tree` would have accepted:
    the length of the path through those nodes that the tokens follow from the root."""
    node, n = -1, 0
    for token in tokens:
        node = tree.children.get((node, int(token)), -1)
        if node < 0 or node not in nodes:
            break
        n += 1
    return n


class Realization:
    """Decayed sums of promised and accepted extra tokens; `ratio` scales the probabilities the allocator
    sees. `record` takes a verified step's outcome, `shadow` an unverified step's would-be nodes and
    `resolve` scores the shadows whose tokens have been generated."""

    def __init__(self, prior: float = PRIOR, decay: float = DECAY) -> None:
        if prior <= 0 or not 0.0 <= decay < 1.0:
            raise ValueError(f"realization needs prior > 0 and 0 <= decay < 1, got {prior}, {decay}")
        self.promised = prior
        self.realized = prior
        self.decay = decay
        self._shadows: list[_Shadow] = []

    @property
    def ratio(self) -> float:
        """Accepted / promised extra tokens over recent steps, at most 1 (1 before any evidence)."""
        return min(1.0, self.realized / self.promised)

    def record(self, promised: float, accepted: int) -> None:
        """One step's evidence: its verified nodes' path probabilities summed, and the guesses accepted."""
        self.promised = self.decay * self.promised + promised
        self.realized = self.decay * self.realized + accepted

    def shadow(self, position: int, tree: CandidateTree, nodes: Sequence[int]) -> None:
        """Nodes of `tree` (its first tokens at context index `position`) a step would have verified but
        did not: scored by `resolve` once the context holds the tokens they guess."""
        if not nodes:
            return
        if len(self._shadows) == MAX_SHADOWS:
            self._shadows.pop(0)
        deepest = max(tree.depths[n] for n in nodes)
        self._shadows.append(_Shadow(position, tree, frozenset(nodes), sum(tree.probs[n] for n in nodes),
                                     position + deepest))

    def resolve(self, context: Sequence[int]) -> None:
        """Score every shadow whose guessed positions `context` now covers, oldest first."""
        ready = [s for s in self._shadows if len(context) >= s.end]
        if not ready:
            return
        self._shadows = [s for s in self._shadows if len(context) < s.end]
        for s in ready:
            self.record(s.promised, accepted_along(s.tree, s.nodes, context[s.position : s.end]))

    @property
    def pending(self) -> int:
        """Shadows awaiting their tokens."""
        return len(self._shadows)
