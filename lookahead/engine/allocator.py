"""How much of a step's candidate tree to verify: the subtree with the most expected tokens per unit cost.

A step that verifies the nodes S of the tree (plus `aux_rows` rows of an auxiliary branch, if it runs)
yields, in expectation,

    E[tokens] = 1 + sum_{i in S} p_i  (+ aux_value when the aux branch runs)

where p_i is the calibrated probability that node i's whole path is accepted (engine/calibration.py)
and the 1 is the model's own token, which every step yields. It costs c(1 + |S| + aux_rows) one-row
passes, c being the device's cost curve (engine/costs.py). The allocator maximises E[tokens] / c.

Because a node's path probability never exceeds its parent's, the best subtree of k nodes is the k most
probable nodes (ties broken shallow-first, so every parent comes before its children), and the best
allocation is the best of those prefixes for k = 0 .. max. Rows below a width floor cost nothing extra
(c is flat there), so they are always filled while any node has p > 0. An empty allocation (k = 0,
no aux) is a plain one-token step: that is the "do not speculate" decision.

With `chain_only` (exact steps on a device whose rows are not invariant to masked gaps), only one
root-to-leaf path may be verified; the allocator then picks the best prefix of the best path.

This is a pure function: the generation loop calls it before each step, and a batched scheduler can call
it with one cost curve for many requests' trees.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lookahead.engine.draft import CandidateTree


@dataclass(frozen=True)
class Allocation:
    """nodes: tree nodes to verify (every parent before its children); aux: run the aux branch;
    width: query rows (1 + len(nodes) + aux rows); expected: E[tokens]; cost: c(width)."""

    nodes: tuple[int, ...]
    aux: bool
    width: int
    expected: float
    cost: float

    @property
    def rate(self) -> float:
        """Expected tokens per one-row pass."""
        return self.expected / self.cost


def allocate(tree: CandidateTree, probs: Sequence[float], cost: Callable[[int], float], *, aux_rows: int = 0,
             aux_value: float = 0.0, chain_only: bool = False, max_width: int = 64) -> Allocation:
    """The allocation of `tree` (node path probabilities `probs`) with the most expected tokens per unit
    cost. `aux_rows`/`aux_value`: an auxiliary branch's rows and the tokens it is expected to earn
    (0 rows: none); `max_width`: most query rows a step may have."""
    if len(probs) != len(tree):
        raise ValueError(f"{len(probs)} probabilities for a tree of {len(tree)} nodes")
    choices = [False, True] if aux_rows > 0 and 1 + aux_rows <= max_width else [False]
    best: Allocation | None = None
    for aux in choices:
        fixed = 1 + (aux_rows if aux else 0)  # the root and the aux rows
        base = 1.0 + (aux_value if aux else 0.0)
        for order in _orders(tree, probs, chain_only):
            gained = base
            for k in range(0, min(len(order), max_width - fixed) + 1):
                if k:
                    gained += probs[order[k - 1]]
                c = cost(fixed + k)
                if best is None or gained / c > best.rate + 1e-12:
                    best = Allocation(tuple(order[:k]), aux, fixed + k, gained, c)
    assert best is not None
    return best


def _orders(tree: CandidateTree, probs: Sequence[float], chain_only: bool) -> list[list[int]]:
    """Node orders whose every prefix is a verifiable subtree, best prefixes first: one order over the
    whole tree by probability, or (chain_only) one per root-to-leaf path."""
    n = len(tree)
    if not chain_only:
        return [sorted(range(n), key=lambda i: (-probs[i], tree.depths[i], i))]
    leaves = set(range(n)) - set(tree.parents)
    paths = []
    for leaf in sorted(leaves):
        path = []
        node = leaf
        while node >= 0:
            path.append(node)
            node = tree.parents[node]
        paths.append(path[::-1])
    return paths or [[]]
