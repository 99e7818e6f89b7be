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

With `chain_only` (exact steps on a device whose rows are not invariant to masked gaps, and no key
views), only one root-to-leaf path may be verified; the allocator then picks the best prefix of the
best path. Where exact steps verify branches over key views (engine/attention.py), a pass in which any
request verifies more than one branch costs `views_cost(width)` instead of `cost(width)` (the views'
extra attention work, measured with the curve): the allocator weighs the best single chains at the
plain cost against the best subtrees at the views cost, per width.

This is a pure function: the generation loop calls it before each step, and a batched scheduler can call
it with one cost curve for many requests' trees.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

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
    branches: bool = False  # the nodes are not one chain (exact steps verify them over key views)

    @property
    def rate(self) -> float:
        """Expected tokens per one-row pass."""
        return self.expected / self.cost


@dataclass(frozen=True)
class Candidates:
    """One request's share of a step for the allocator: its tree and node path probabilities, its aux
    branch (`aux_rows` rows expected to earn `aux_value` tokens; 0 rows: none), whether only one path
    may be verified, `fixed`: run as proposed at this many rows (no sizing; None: size it), and
    `max_width`: the most rows this request's step may use (its configuration's widest step)."""

    tree: CandidateTree
    probs: Sequence[float]
    aux_rows: int = 0
    aux_value: float = 0.0
    chain_only: bool = False
    fixed: int | None = None
    max_width: int = 64


def allocate(tree: CandidateTree, probs: Sequence[float], cost: Callable[[int], float], *, aux_rows: int = 0,
             aux_value: float = 0.0, chain_only: bool = False, max_width: int = 64,
             views_cost: Callable[[int], float] | None = None) -> Allocation:
    """The allocation of `tree` (node path probabilities `probs`) with the most expected tokens per unit
    cost. `aux_rows`/`aux_value`: an auxiliary branch's rows and the tokens it is expected to earn
    (0 rows: none); `max_width`: most query rows a step may have. The batch-of-one `allocate_batch`."""
    if len(probs) != len(tree):
        raise ValueError(f"{len(probs)} probabilities for a tree of {len(tree)} nodes")
    return allocate_batch([Candidates(tree, probs, aux_rows, aux_value, chain_only, max_width=max_width)], cost,
                          max_width=max_width, views_cost=views_cost)[0]


def allocate_batch(requests: Sequence[Candidates], cost: Callable[[int], float], *, max_width: int = 64,
                   max_rows: int | None = None, views_cost: Callable[[int], float] | None = None) -> list[Allocation]:
    """One step's rows across the requests of a batch. The pass is rectangular: every request runs at
    the same width w (its unused rows are padding), so the step costs c(B * w) and yields the sum of
    each request's best allocation within w rows. The allocator picks the w with the most expected
    tokens per unit cost, w >= every fixed request's width and B * w <= `max_rows` (None: no cap); every
    request gets its root row whatever the cap. At B = 1 this is the single request's best allocation.
    `views_cost`: the cost of a pass in which some request verifies branches (None: `cost`). A `cost`
    with a `many(widths)` method (costs.Price) prices every width in one call."""
    b = len(requests)
    if not b:
        return []
    least = max([1] + [r.fixed for r in requests if r.fixed is not None])
    most = max(least, min(max_width, (max_rows // b) if max_rows else max_width))
    # Past the widest any request can fill, a width adds no expected tokens and costs no less (c(w) is
    # already the cheapest width >= w), so it never wins: price only the widths up to there.
    most = max(least, min(most, max(1 + len(r.tree) + r.aux_rows for r in requests)))
    if all(r.chain_only for r in requests):
        kinds = [[_best_within(r, most, branches=False) for r in requests]]  # [kind][B][w]: one path each
    elif views_cost is None:
        # Branches cost what a chain of their width costs, and the best subtree of each size holds at least
        # the expected tokens of any path of that size: the subtrees alone decide.
        kinds = [[_best_within(r, most, branches=True) for r in requests]]
    else:  # one path each at the plain cost, or two chains (one key view each) at the views cost
        kinds = [[_best_within(r, most, branches=False) for r in requests],
                 [_best_within(r, most, branches=True, two_chains=True) for r in requests]]
    widths = range(least, most + 1)
    many = getattr(cost, "many", None)  # a sweep over every width at once (costs.Price): once per step
    plain = dict(zip(widths, many([b * w for w in widths]) if many else [cost(b * w) for w in widths]))
    viewed: dict[int, float] = {}
    columns = [list(zip(*kind)) for kind in kinds]  # [kind][w]: each request's option within w rows
    best_w, best_rate, best_kind = least, -1.0, 0
    for w in widths:  # narrowest first, and the first kind, on ties
        for kind, column in enumerate(columns):
            options = column[w]
            price = plain[w]
            if views_cost is not None and any(o.branches for o in options):
                if w not in viewed:
                    viewed[w] = views_cost(b * w)
                price = viewed[w]
            rate = sum([o.expected for o in options]) / price
            if rate > best_rate + 1e-12:
                best_w, best_rate, best_kind = w, rate, kind
    options = columns[best_kind][best_w]
    shared = viewed[best_w] if views_cost is not None and any(o.branches for o in options) else plain[best_w]
    return [o.build(shared) for o in options]


class _Option(NamedTuple):
    """A request's best allocation within some width, before it is built: the first k nodes of `order`
    (the allocator compares many and builds one per request)."""

    expected: float
    order: Sequence[int]
    k: int
    aux: bool
    width: int
    branches: bool

    def build(self, cost: float) -> Allocation:
        return Allocation(tuple(self.order[: self.k]), self.aux, self.width, self.expected, cost, self.branches)


_NOTHING = _Option(1.0, (), 0, False, 1, False)


def _best_within(request: Candidates, most: int, branches: bool, two_chains: bool = False) -> list[_Option]:
    """For each width w = 0 .. most: the allocation of `request` with the most expected tokens using at
    most w rows (index 0 unused), over one root-to-leaf path, or (`branches`, unless the request is
    chain_only) over any subtree (`two_chains`: of at most two leaves). A fixed request has one
    allocation: everything, at its own width."""
    tree, probs, depths = request.tree, request.probs, request.tree.depths
    cap = max(1, min(most, request.max_width))
    if request.fixed is not None:
        everything = range(len(tree))
        whole = _Option(1.0 + sum(probs) + request.aux_value, everything, len(tree), request.aux_rows > 0,
                        request.fixed, _branched(tree, everything))
        return [whole] * (most + 1)
    best: list[_Option | None] = [None] * (cap + 1)
    choices = [False, True] if request.aux_rows > 0 and 1 + request.aux_rows <= cap else [False]
    if branches and not request.chain_only:
        # The k likeliest nodes are the best k-node subtree, for every k (a node is never likelier than its
        # parent, and ties go shallow-first, so parents come first): no path can hold more. Kept to two
        # chains, paths may (the greedy two-chain order is not proven best), so they compete too.
        likeliest = sorted(range(len(tree)), key=lambda i: (-probs[i], depths[i], i))
        orders = [_two_chains(tree, likeliest)] + _paths(tree) if two_chains else [likeliest]
    else:
        orders = _paths(tree)
    for aux in choices:
        fixed = 1 + (request.aux_rows if aux else 0)  # the root and the aux rows
        gained = 1.0 + (request.aux_value if aux else 0.0)
        for order in orders:
            total = gained
            depths_seen: set[int] = set()  # a chain has at most one node at each depth
            branched = False
            for k in range(0, min(len(order), cap - fixed) + 1):
                if k:
                    node = order[k - 1]
                    total += probs[node]
                    branched = branched or depths[node] in depths_seen
                    depths_seen.add(depths[node])
                w = fixed + k
                here = best[w]
                if here is None or total > here.expected + 1e-12:
                    best[w] = _Option(total, order, k, aux, w, branched)
    out: list[_Option] = []
    for w in range(cap + 1):  # within w rows: the best of every narrower width too
        here = best[w]
        if out and (here is None or out[-1].expected >= here.expected - 1e-12):
            here = out[-1]
        out.append(here if here is not None else _NOTHING)
    return out + [out[-1]] * (most - cap)  # wider than its own cap: the same allocation, padded


def _two_chains(tree: CandidateTree, likeliest: Sequence[int]) -> list[int]:
    """The likeliest nodes first, kept to two chains from the root: every prefix is the best subtree
    of its size with at most two leaves. A node is never likelier than its parent, so taking nodes by
    probability keeps parents first; a node whose parent (or the root) already has a chosen child
    starts a chain, and one that would start a third is skipped, with its subtree. Two chains are one
    key view in an exact step: its cost is a fixed, measured surcharge (engine/costs.py), where each
    further view would gather the whole cached prefix again."""
    chosen: set[int] = set()
    has_child: set[int] = set()
    chains = 0
    out = []
    for node in likeliest:
        parent = tree.parents[node]
        if parent >= 0 and parent not in chosen:
            continue
        starts = parent in has_child or chains == 0
        if starts and chains == 2:
            continue
        chains += starts
        chosen.add(node)
        has_child.add(parent)
        out.append(node)
    return out


def _branched(tree: CandidateTree, nodes: Sequence[int]) -> bool:
    depths = [tree.depths[n] for n in nodes]
    return len(set(depths)) < len(depths)


def chain_first(tree: CandidateTree, nodes: Sequence[int]) -> list[int]:
    """`nodes` (a subtree, parents first) reordered so that the likeliest path comes first (from the
    root, always the child with the highest path probability), then the rest in their order: the
    subtree's first chain (CandidateTree.first_chain) is then its best path, the rows an exact step
    computes without key views."""
    chosen = set(nodes)
    path: list[int] = []
    parent = -1
    while True:
        children = [n for n in nodes if tree.parents[n] == parent]
        if not children:
            break
        parent = max(children, key=lambda n: (tree.probs[n], -n))
        path.append(parent)
    on_path = set(path)
    return path + [n for n in nodes if n not in on_path and n in chosen]


def _paths(tree: CandidateTree) -> list[list[int]]:
    """One node order per root-to-leaf path (each prefix of a path is a chain)."""
    n = len(tree)
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
