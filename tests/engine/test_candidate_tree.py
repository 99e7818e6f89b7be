"""The candidate trie: node layout and its ancestor matrix, with the expected answers written out.

ancestors_matrix()[i, j] is True when node j is node i or one of its ancestors: exactly the
candidate tokens that node i may attend to in the verification branch (plus the prefix and the root,
which every node sees). Written as one string per node: "1" sees, "." does not.
"""

from __future__ import annotations

import pytest
import torch

from lookahead.engine.draft import CandidateTree


def rows(matrix: torch.Tensor) -> list[str]:
    return ["".join("1" if v else "." for v in row.tolist()) for row in matrix]


def tree_of(*continuations: list[int]) -> CandidateTree:
    tree = CandidateTree()
    for i, cont in enumerate(continuations):
        tree.add(cont, source=f"s{i}")
    return tree


def test_empty_tree() -> None:
    m = CandidateTree().ancestors_matrix()
    assert m.shape == (0, 0) and m.dtype == torch.bool


def test_one_chain_is_lower_triangular() -> None:
    tree = tree_of([5, 6, 7])
    assert (tree.tokens, tree.parents, tree.depths) == ([5, 6, 7], [-1, 0, 1], [1, 2, 3])
    assert rows(tree.ancestors_matrix()) == ["1..", "11.", "111"]


def test_shared_prefixes_are_merged_and_siblings_are_hidden() -> None:
    # root -> 1 -> 2 -> 3
    #              2 -> 4      ([1, 2, 4] shares "1 2")
    #      -> 5                (a second branch from the root)
    #         1 -> 6           ([1, 6] shares "1")
    #              2 -> 3      ([1, 2, 3] again: nothing new)
    tree = tree_of([1, 2, 3], [1, 2, 4], [5], [1, 6], [1, 2, 3])
    # node:          0  1  2  3  4  5
    assert tree.tokens == [1, 2, 3, 4, 5, 6]
    assert tree.parents == [-1, 0, 1, 1, -1, 0]
    assert tree.depths == [1, 2, 3, 3, 1, 2]
    assert tree.sources == ["s0", "s0", "s0", "s1", "s2", "s3"]  # the source that minted each node
    assert rows(tree.ancestors_matrix()) == [
        # 0 1 2 3 4 5
        "1.....",  # 1
        "11....",  # 1 2
        "111...",  # 1 2 3
        "11.1..",  # 1 2 4: not its sibling 3
        "....1.",  # 5: a branch of its own
        "1....1",  # 1 6: not 2 (its sibling) nor 2's children
    ]


def test_same_token_under_different_parents_is_two_nodes() -> None:
    # Token 9 after 1 and token 9 after 2 are different guesses for different positions.
    tree = tree_of([1, 9], [2, 9], [9])
    assert tree.tokens == [1, 9, 2, 9, 9] and tree.parents == [-1, 0, -1, 2, -1]
    assert rows(tree.ancestors_matrix()) == [
        "1....",
        "11...",
        "..1..",
        "..11.",
        "....1",
    ]


def test_every_row_is_the_path_from_the_root() -> None:
    # The invariant behind the tables, on a bushier tree: row i marks exactly the nodes on the
    # parent chain of i, so its depth equals the number of marks.
    tree = tree_of([1, 2, 3, 4], [1, 3], [2, 2, 2], [1, 2, 5, 6], [2, 7])
    m = tree.ancestors_matrix()
    for i in range(len(tree)):
        chain, j = set(), i
        while j >= 0:
            chain.add(j)
            j = tree.parents[j]
        assert set(torch.nonzero(m[i]).flatten().tolist()) == chain
        assert int(m[i].sum()) == tree.depths[i]


def test_cap_siblings_keeps_children_within_their_parent() -> None:
    # Root -> 1 (0.8). Under 1, three guessed next tokens: 2 (0.6, its child 3 at 0.5), 4 (0.5, its
    # child 5 at 0.4) and 6 (0.1). At most one of 2, 4, 6 follows 1, so together they may hold at most
    # 1's 0.8: 2 keeps 0.6 (likeliest first), 4 gets the 0.2 left (factor 0.4, so its child 5 gets
    # 0.4 * 0.4 = 0.16), 6 gets nothing left (0.0). 3 is 2's only child and within 0.6: unchanged.
    # A second first token 7 (0.9) is the root's child: left alone (the pool's learned factors).
    tree = CandidateTree()
    tree.add([1, 2, 3], probs=[0.8, 0.6, 0.5])
    tree.add([1, 4, 5], probs=[0.8, 0.5, 0.4])
    tree.add([1, 6], probs=[0.8, 0.1])
    tree.add([7], probs=[0.9])
    tree.cap_siblings()
    by_path = {tuple(path): p for path, p in zip(paths_of(tree), tree.probs)}
    assert by_path == pytest.approx({(1,): 0.8, (1, 2): 0.6, (1, 2, 3): 0.5, (1, 4): 0.2, (1, 4, 5): 0.16,
                                     (1, 6): 0.0, (7,): 0.9})


def test_cap_siblings_leaves_a_coherent_tree_alone() -> None:
    # 1 (0.9) -> 2 (0.5) and 1 -> 3 (0.3): 0.8 <= 0.9, nothing to cap; a chain is always coherent.
    tree = CandidateTree()
    tree.add([1, 2], probs=[0.9, 0.5])
    tree.add([1, 3, 4], probs=[0.9, 0.3, 0.2])
    tree.cap_siblings()
    assert tree.probs == pytest.approx([0.9, 0.5, 0.3, 0.2])


def paths_of(tree: CandidateTree) -> list[list[int]]:
    out = []
    for node in range(len(tree)):
        path = []
        while node >= 0:
            path.append(tree.tokens[node])
            node = tree.parents[node]
        out.append(path[::-1])
    return out
