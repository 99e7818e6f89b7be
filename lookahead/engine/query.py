"""One step's query (tokens, positions, visibility, rows to read back) and its verification, as pure functions.

Layout of a step with a candidate tree of T nodes and an auxiliary branch of A rows (Q = 1 + T + A):

    row   0          1 .. T                    T+1 .. T+A
          root       candidate tree nodes      aux rows (the Jacobi window)
    pos   p          p + depth                 p + offset

The root comes first and the tree nodes right after it, so the root and every node of the tree's
first chain see their visible keys as one gap-free run (cached prefix, root, ancestors), exactly as
the same tokens do when decoded one at a time. At reduced precision that is what makes a verified
row bit-identical to autoregressive decoding (README, "Lossless, exactly"); rows after a row's last
visible key change nothing for it. Aux rows only mint guesses, so they may see keys with gaps.

A node off the first chain sees its ancestors with other branches' keys between them. Where exactness
matters there are two ways to make its row come out as the same tokens do decoded one at a time:
- aligned offsets (`align_tree`): the cache writes each node's key at an offset congruent to its depth
  modulo the kernels' reduction period (engine/attention.py KEY_PERIOD), inside the same reduction
  block as its autoregressive index; the keys between are masked. Each visible key then sits in the
  same lane of the same block, in the same order, as in the gap-free run, and the masked ones add exact
  zeros. E.g. first chain a->b and branch c->d off the root at an odd position p, period 16: rows
  [root a b c d] at offsets [0 1 2 17 18] (c at depth 1 goes to the next free offset = 1 mod 16). At an
  even p, c's index p + 1 would pair it with the root in bfloat16's key pairs, a slot a already holds,
  so c and d are left out: only one child of such a node can be verified. Costs only masked keys;
- key views (`branch_views`; engine/attention.py KeyView): the branch's rows are computed again over
  their keys gathered into position order (cached prefix, root, the branch's nodes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lookahead.engine.draft import AuxBranch, CandidateTree


@dataclass(frozen=True)
class StepQuery:
    """tokens/positions: [Q]; local: [Q, Q] bool (row i may see new key j); keep: [K] ascending rows
    whose logits are read back (root, tree nodes, aux out rows); n_tree: T; views: the tree's branch
    views (`branch_views`), if asked for."""

    tokens: torch.Tensor
    positions: torch.Tensor
    local: torch.Tensor
    keep: torch.Tensor
    n_tree: int
    views: tuple[tuple[list[int], list[int]], ...] = ()
    offsets: torch.Tensor | None = None  # [Q] distinct: where the cache writes each row's key (None: in order)

    @property
    def width(self) -> int:
        return int(self.tokens.shape[0])


def build_query(root: int, p: int, tree: CandidateTree, aux: AuxBranch | None, views: bool = False,
                offsets: list[int] | None = None) -> StepQuery:
    """The step's input for root token `root` at position `p` (the cache holds positions 0..p-1);
    `views`: with the branch views of the tree (exact steps at reduced precision); `offsets`: the cache
    offsets of the root and the tree's nodes (`align_tree`; aux rows take the free ones, gaps first)."""
    t = len(tree)
    a = 0 if aux is None else int(aux.tokens.shape[0])
    q = 1 + t + a
    # Rows 0..t in Python lists, then one tensor each (a step's query has ~5-20 rows: per-element torch
    # operations would cost more than the lists).
    tokens = torch.tensor([root, *tree.tokens], dtype=torch.long)
    positions = torch.tensor([p, *(p + d for d in tree.depths)], dtype=torch.long)
    seen = [[0]]  # [row]: the rows row i sees (the root, then its ancestors and itself); parents come first
    for i, parent in enumerate(tree.parents):
        seen.append([*seen[parent + 1], 1 + i])
    local = torch.zeros(q, q, dtype=torch.bool)
    local[[i for i, cols in enumerate(seen) for _ in cols], [j for cols in seen for j in cols]] = True
    keep = torch.arange(1 + t)
    if aux is not None and a:
        rows = slice(1 + t, q)
        tokens = torch.cat([tokens, aux.tokens])
        positions = torch.cat([positions, p + aux.offsets])
        local[rows, 0] = True  # every row sees the root
        local[rows, rows] = aux.visible
        keep = torch.cat([keep, 1 + t + aux.out_rows])
    placed = None
    if offsets is not None:
        if len(offsets) != 1 + t:
            raise ValueError(f"{len(offsets)} offsets for a root and {t} tree nodes")
        tree_at = torch.tensor(offsets)
        placed = torch.cat([tree_at, free_offsets(tree_at, a)])  # aux rows in the gaps first
    return StepQuery(tokens, positions, local, keep, t, branch_views(tree) if views else (), placed)


def align_tree(tree: CandidateTree, p: int, period: int, block: int | None, pairs: bool = True) -> tuple[CandidateTree, list[int]]:
    """Cache offsets for the root (0) and the nodes of `tree` (root at position p) such that every node's
    key is reduced exactly as in autoregressive decoding, where its key index would be p + depth
    (engine/attention.py KeyLayout gives the rules of a model's passes):
    - each node's offset is its depth modulo `period` (lanes of the float32 softmax's sum);
    - with `pairs`, a node whose index p + depth is odd is its parent's pair partner (bfloat16 matmuls
      reduce keys in pairs), so it must sit right after its parent: only one child per such parent can,
      the likeliest (the one `allocator.chain_first` puts first); the others are left out with their
      subtrees;
    - (p + offset) // block == (p + depth) // block (engine/attention.py KEY_BLOCK), else left out
      (block None: no such rule; with period 1 and no pairs too, every node is kept, laid out gap-free).
    Nodes are laid out depth first, each node's likeliest child right after it (the same offset + 1),
    each further child at the next free offset congruent to its depth. Returns (the tree of the nodes
    kept, in that order, parents first; offsets [1 + kept], ascending)."""
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(tree.parents):
        children.setdefault(parent, []).append(node)
    for kids in children.values():
        kids.sort(key=lambda n: (-tree.probs[n], n))  # likeliest first, as chain_first picks
    order: list[int] = []
    offsets = [0]
    used = 0
    stack: list[tuple[int, int]] = [(n, 0) for n in reversed(children.get(-1, []))]  # (node, parent's offset)
    while stack:
        node, parent_at = stack.pop()
        depth = tree.depths[node]
        if parent_at == used:
            offset = used + 1  # right after its parent
        elif not pairs or (p + depth) % 2 == 0:
            offset = used + 1 + (depth - used - 1) % period  # the next free offset = depth (mod period)
        else:
            continue  # its parent's pair partner, and the slot after the parent is taken
        if block is not None and (p + offset) // block != (p + depth) // block:
            continue
        used = offset
        order.append(node)
        offsets.append(offset)
        stack.extend((child, offset) for child in reversed(children.get(node, [])))
    same = order == list(range(len(tree)))
    return (tree if same else tree.subtree(order)), offsets


def free_offsets(used: torch.Tensor, n: int) -> torch.Tensor:
    """The `n` lowest offsets not in `used` [Q] (rows whose keys need no particular place: dummy rows,
    aux rows, fill the gaps an aligned tree leaves before its span grows)."""
    top = int(used.max()) + 1 if used.numel() else 0
    taken = torch.zeros(top + n, dtype=torch.bool)
    taken[used] = True
    return torch.nonzero(~taken).flatten()[:n]


def branch_views(tree: CandidateTree) -> tuple[tuple[list[int], list[int]], ...]:
    """The rows off the tree's first chain, grouped by branch: for each leaf whose path has nodes no
    earlier group computes, (those nodes' rows, the path's rows from the root: 0, then its nodes'
    1 + i). Nodes are numbered parents first, so a path's rows ascend; a node shared by two branches
    is computed in the first one's view."""
    done = set(range(len(tree.first_chain())))
    out = []
    for leaf in sorted(set(range(len(tree))) - set(tree.parents)):
        path = []
        node = leaf
        while node >= 0:
            path.append(node)
            node = tree.parents[node]
        path.reverse()
        new = [n for n in path if n not in done]
        if new:
            done.update(new)
            out.append(([1 + n for n in new], [0, *(1 + n for n in path)]))
    return tuple(out)


def verify(tree: CandidateTree, root_choice: int, node_choice: Sequence[int]) -> tuple[list[int], list[str], list[int]]:
    """Walk the trie from the root, following the child whose token equals the model's choice.

    root_choice: the model's token after the root; node_choice[i]: its token after tree node i.
    Every matched node is a token the model itself would have produced there, so it is accepted, and
    the model's choice after the last matched node is accepted too (every step yields >= 1 token).
    Returns (accepted tokens, the source of each ("model" for the last), matched node ids in order).
    """
    accepted = [root_choice]
    sources: list[str] = []
    nodes: list[int] = []
    node = tree.children.get((-1, root_choice))
    while node is not None:
        nodes.append(node)
        sources.append(tree.sources[node])
        accepted.append(node_choice[node])
        node = tree.children.get((node, accepted[-1]))
    sources.append("model")
    return accepted, sources, nodes
