"""Table tests for the pure pieces of a step: the query layout (build_query), the verify walk and the
first chain that exact steps verify. Each case writes the expected answer out, with the reason."""

from __future__ import annotations

import torch

from lookahead.candidates.lookahead import JacobiWindow
from lookahead.engine.draft import CandidateTree
from lookahead.engine.query import align_tree, build_query, free_offsets, verify


def tree_of(*continuations: tuple[int, ...], source: str = "ctx") -> CandidateTree:
    tree = CandidateTree()
    for cont in continuations:
        tree.add(cont, source)
    return tree


def bools(rows: list[str]) -> torch.Tensor:
    return torch.tensor([[c == "1" for c in r] for r in rows])


def test_root_only() -> None:
    # a plain one-token step: the root at position p sees itself; its logits are read back
    q = build_query(7, 40, CandidateTree(), None)
    assert q.tokens.tolist() == [7] and q.positions.tolist() == [40]
    assert q.local.tolist() == [[True]] and q.keep.tolist() == [0] and q.n_tree == 0


def test_tree_rows_follow_the_root_and_see_their_ancestors() -> None:
    # candidates "10 11" and "10 12" share their first token: trie nodes 0:10 (depth 1),
    # 1:11 and 2:12 (depth 2, both children of node 0). Rows: root, then the nodes in trie order.
    q = build_query(5, 100, tree_of((10, 11), (10, 12)), None)
    assert q.tokens.tolist() == [5, 10, 11, 12]
    assert q.positions.tolist() == [100, 101, 102, 102]  # both depth-2 nodes guess position p+2
    assert torch.equal(q.local, bools([
        "1000",  # root: itself
        "1100",  # 10: root, itself
        "1110",  # 11: root, 10, itself
        "1101",  # 12: root, 10, itself (not its sibling 11)
    ]))
    assert q.keep.tolist() == [0, 1, 2, 3] and q.n_tree == 3


def test_aux_rows_come_last_and_only_their_out_rows_are_read() -> None:
    # One tree node (row 1) and a Jacobi window of W=2 columns x 2 levels (rows 2..5, level-major).
    # Window token (level l, column i) guesses p+1+l+i and sees the root, level-0 columns 0..i and its
    # own column's levels 1..l; the newest level (rows 4, 5) is read back as the next iterate.
    window = JacobiWindow(2, 3, seed_tokens=[1])
    window.levels = [[20, 21], [22, 23]]
    q = build_query(5, 10, tree_of((30,)), window.branch())
    assert q.tokens.tolist() == [5, 30, 20, 21, 22, 23]
    assert q.positions.tolist() == [10, 11, 11, 12, 12, 13]
    assert torch.equal(q.local, bools([
        "100000",  # root
        "110000",  # tree node 30
        "101000",  # L0 c0 (p+1): root, itself
        "101100",  # L0 c1 (p+2): root, L0 c0, itself
        "101010",  # L1 c0 (p+2): root, L0 c0, itself
        "101101",  # L1 c1 (p+3): root, L0 c0, L0 c1, itself
    ]))
    assert q.keep.tolist() == [0, 1, 4, 5] and q.n_tree == 1


def test_verify_follows_the_models_choices_down_the_trie() -> None:
    # trie 0:10, 1:11 (under 10), 2:12 (under 10). The model picks 10 after the root (node 0 matches),
    # 12 after node 0 (node 2 matches), 99 after node 2 (no child): accepted 10, 12, then its own 99.
    tree = tree_of((10, 11), source="jacobi")
    tree.add((10, 12), "context")
    accepted, sources, nodes = verify(tree, 10, [12, 77, 99])
    assert accepted == [10, 12, 99]
    assert sources == ["jacobi", "context", "model"]  # node 2 was minted by the second source
    assert nodes == [0, 2]


def test_verify_with_no_match_accepts_the_models_token_only() -> None:
    tree = tree_of((10, 11))
    assert verify(tree, 42, [11, 12]) == ([42], ["model"], [])


def test_verify_stops_at_the_first_mismatch_even_if_a_deeper_node_would_match() -> None:
    # 10 matches, but the model picks 13 after it while the trie has 11 there: node 1's own choice (12)
    # is never looked at, because node 1 is not a token the model produced.
    assert verify(tree_of((10, 11, 12)), 10, [13, 12, 5]) == ([10, 13], ["ctx", "model"], [0])


def test_first_chain_is_the_best_ranked_continuation() -> None:
    # continuations added best first: (1 2 3) then (1 4); the first chain is nodes 0..2 only
    tree = tree_of((1, 2, 3), (1, 4))
    chain = tree.first_chain()
    assert (chain.tokens, chain.parents, chain.depths) == ([1, 2, 3], [-1, 0, 1], [1, 2, 3])
    assert chain.children == {(-1, 1): 0, (0, 2): 1, (1, 3): 2}
    # (5) then (6 7): the second continuation starts a new branch at the root, not part of the chain
    assert tree_of((5,), (6, 7)).first_chain().tokens == [5]
    # a single chain is returned as is
    single = tree_of((8, 9))
    assert single.first_chain() is single
    assert CandidateTree().first_chain().tokens == []


def test_branch_views_group_the_rows_off_the_first_chain_by_branch() -> None:
    # (1 2 3), (1 4), (5 6), (5 7): nodes 0:1 1:2 2:3 | 3:4 (child of 0) | 4:5 5:6 (child of 4) | 6:7 (child
    # of 4). First chain: nodes 0..2 (rows 1..3), no view. Node 3 sees root, node 0, itself: rows
    # [4], path [0, 1, 4]. Branch 5 6: rows [5, 6], path [0, 5, 6]. Node 6 (token 7) shares node 4
    # with the previous view, which already computes it: rows [7] only, path [0, 5, 7].
    tree = tree_of((1, 2, 3), (1, 4), (5, 6), (5, 7))
    q = build_query(9, 50, tree, None, views=True)
    assert q.views == (([4], [0, 1, 4]), ([5, 6], [0, 5, 6]), ([7], [0, 5, 7]))
    # a single chain needs no view, nor does a query built without them
    assert build_query(9, 50, tree_of((1, 2, 3)), None, views=True).views == ()
    assert build_query(9, 50, tree, None).views == ()


# Aligned offsets (align_tree): where each node's key goes so that the kernels reduce it as in
# autoregressive decoding, where its key would be at p + depth: offset = depth (mod period); a node at an
# odd index (p + depth) right after its parent (keys are reduced in pairs); the same block as p + depth.


def test_aligned_branches_start_at_the_next_offset_congruent_to_their_depth() -> None:
    # p = 11 (odd): depth-1 keys sit at even indices 12, so a second depth-1 branch may start anywhere
    # congruent to 1 (mod 16). First chain a=10 -> b=11 at offsets 1, 2; branch c=12 at 17, its child d=13 at 18.
    tree, offsets = align_tree(tree_of((10, 11), (12, 13)), 11, 16, 1024)
    assert tree.tokens == [10, 11, 12, 13] and offsets == [0, 1, 2, 17, 18]


def test_a_node_that_pairs_with_its_parent_stays_right_after_it_or_is_left_out() -> None:
    # p = 10 (even): depth-1 keys sit at index 11, the root's pair partner; only one child of the root can
    # sit right after it, the likeliest (all 1.0 here, so the first): branch c=12 -> 13 is left out whole.
    tree, offsets = align_tree(tree_of((10, 11), (12, 13)), 10, 16, 1024)
    assert tree.tokens == [10, 11] and offsets == [0, 1, 2]
    # at depth 2 (index 12, even) a sibling may branch: 10 -> 11 and 10 -> 14 -> 15
    tree, offsets = align_tree(tree_of((10, 11), (10, 14, 15)), 10, 16, 1024)
    assert tree.tokens == [10, 11, 14, 15] and offsets == [0, 1, 2, 18, 19]


def test_without_the_pair_rule_a_second_child_branches_at_any_depth() -> None:
    # pairs=False (the C++ kernel's passes, engine/attention.py key_layout): p = 10 (even) puts depth 1 at
    # index 11, which the pair rule keeps for the root's likeliest child alone; without it the second
    # child c=12 starts a run at the next offset congruent to its depth, 17, and its child d=13 follows at 18.
    tree, offsets = align_tree(tree_of((10, 11), (12, 13)), 10, 16, 1024, pairs=False)
    assert tree.tokens == [10, 11, 12, 13] and offsets == [0, 1, 2, 17, 18]
    # the period and block rules still hold: p = 1017, the branch's key 1034 would leave the 1024 block
    tree, offsets = align_tree(tree_of((10, 11), (12,)), 1017, 16, 1024, pairs=False)
    assert tree.tokens == [10, 11] and offsets == [0, 1, 2]


def test_gap_free_layout_keeps_every_node_in_depth_first_order() -> None:
    # period 1, no block, no pairs (the C++ kernel's passes, engine/attention.py GAP_FREE): every node is
    # kept, laid out depth first with no gaps: 10 -> 11 at 1, 2, then 12 -> 13 at 3, 4 (even near a block
    # end: p = 1017 keeps the branch a 1024 block rule would drop).
    for p in (10, 11, 1017):
        tree, offsets = align_tree(tree_of((10, 11), (12, 13)), p, 1, None, pairs=False)
        assert tree.tokens == [10, 11, 12, 13] and offsets == [0, 1, 2, 3, 4]


def test_the_likeliest_child_continues_its_parents_run() -> None:
    # Laid out depth first, likeliest child first: here c (p=0.6) is likelier than a (p=0.5), so c takes
    # offset 1 and a, the second child of the root, starts a run at 17 (p = 11: depth 1 is even, allowed).
    tree = CandidateTree()
    tree.add((10,), "ctx", [0.5])
    tree.add((12,), "ctx", [0.6])
    out, offsets = align_tree(tree, 11, 16, 1024)
    assert out.tokens == [12, 10] and offsets == [0, 1, 17]


def test_a_node_that_would_leave_its_key_block_is_left_out() -> None:
    # p = 1017: depth 1 is index 1018 (even), but the branch's offset 17 puts its key at 1034, past the
    # 1024-key block its autoregressive key 1018 sits in (attention sums each block apart).
    tree, offsets = align_tree(tree_of((10, 11), (12,)), 1017, 16, 1024)
    assert tree.tokens == [10, 11] and offsets == [0, 1, 2]


def test_free_offsets_fill_the_gaps_first() -> None:
    # dummy and aux rows need no particular place: the lowest offsets the tree left free
    assert free_offsets(torch.tensor([0, 1, 2, 17]), 3).tolist() == [3, 4, 5]
    assert free_offsets(torch.tensor([0, 1, 2]), 2).tolist() == [3, 4]


def test_aux_rows_take_the_gaps_of_an_aligned_tree() -> None:
    window = JacobiWindow(2, 3, seed_tokens=[1])
    window.levels = [[20, 21], [22, 23]]
    tree, offsets = align_tree(tree_of((10,), (12,)), 11, 16, 1024)  # offsets [0, 1, 17]
    q = build_query(5, 11, tree, window.branch(), offsets=offsets)
    assert q.offsets.tolist() == [0, 1, 17, 2, 3, 4, 5]
