"""Hand-written cases for token recycling (candidates/recycling.py): an adjacency built from the model's
top-k successors, walked best-first from the root. Each case spells out the expected candidates.

With the default prior (0.6 for rank 0, times 0.4 per rank below it) a path's score is the product of
its ranks' priors, e.g. rank 0 then rank 0: 0.36; rank 1 at depth 1: 0.24; rank 0 then rank 1: 0.144.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from lookahead.candidates.recycling import RecyclingSource, SuccessorTable
from lookahead.engine.sources import Candidate, CandidateSource, Observation, WantsSuccessors


def learn(src: RecyclingSource, rows: Sequence[tuple[int, tuple[int, ...]]], context: Sequence[int] = (0,),
          accepted: Sequence[int] = ()) -> None:
    src.observe(Observation(context=context, accepted=accepted, successors=rows))


def toks(cands: list[Candidate]) -> list[tuple[int, ...]]:
    return [c.tokens for c in cands]


def source(rows: Sequence[tuple[int, tuple[int, ...]]], **kw: int) -> RecyclingSource:
    src = RecyclingSource(**kw)
    learn(src, rows)
    return src


def bushy(top_k: int = 8) -> RecyclingSource:
    # Every token t in 0..99 is followed by t+1, t+2, t+3 (best first): a wide tree at every node.
    return source([(t, (t + 1, t + 2, t + 3)) for t in range(100)], top_k=top_k)


def assert_well_formed(cands: list[Candidate], max_tokens: int, limit: int) -> None:
    paths = toks(cands)
    assert len(paths) <= limit
    assert all(1 <= len(p) <= max_tokens for p in paths)
    assert len(set(paths)) == len(paths)
    for a in paths:
        for b in paths:
            assert a == b or a != b[: len(a)], f"{a} is a prefix of {b}"
    assert all(c.source == "recycle" and 0 <= c.feature < 64 for c in cands)


def test_protocols() -> None:
    src = RecyclingSource(top_k=4)
    assert isinstance(src, CandidateSource) and isinstance(src, WantsSuccessors)
    assert src.name == "recycle" and src.top_k == 4


def test_empty_adjacency_gives_nothing() -> None:
    # Nothing seen yet: no guesses.
    assert RecyclingSource().candidates([1, 2, 3], max_tokens=5, limit=4) == []
    # Rows for other tokens only: the root (3) has no row, so still nothing.
    assert source([(1, (2,)), (2, (3,))]).candidates([1, 2, 3], max_tokens=5, limit=4) == []
    # Degenerate requests.
    src = source([(1, (2,))])
    assert src.candidates([], 5, 4) == []
    assert src.candidates([1], 0, 4) == []
    assert src.candidates([1], 5, 0) == []


def test_chain_gives_greedy_chain() -> None:
    # a -> b -> c -> d with one successor each: the only path from a is (b, c, d); d has no row.
    a, b, c, d = 10, 11, 12, 13
    src = source([(a, (b,)), (b, (c,)), (c, (d,))])
    assert toks(src.candidates([5, a], max_tokens=7, limit=4)) == [(b, c, d)]
    # max_tokens cuts it.
    assert toks(src.candidates([5, a], max_tokens=2, limit=4)) == [(b, c)]
    # From b it starts at c.
    assert toks(src.candidates([a, b], max_tokens=7, limit=4)) == [(c, d)]


def test_greedy_first_then_best_branch_points() -> None:
    # 1 -> (2, 9), 2 -> (3, 8), 3 -> (4, 7). Greedy chain (2, 3, 4) first. Alternatives by score:
    # (9,) = 0.24 > (2, 8) = 0.6 * 0.24 = 0.144 > (2, 3, 7) = 0.36 * 0.24 = 0.0864.
    src = source([(1, (2, 9)), (2, (3, 8)), (3, (4, 7))])
    assert toks(src.candidates([1], max_tokens=3, limit=4)) == [(2, 3, 4), (9,), (2, 8), (2, 3, 7)]
    assert toks(src.candidates([1], max_tokens=3, limit=2)) == [(2, 3, 4), (9,)]
    # With limit 1 only the greedy chain.
    assert toks(src.candidates([1], max_tokens=3, limit=1)) == [(2, 3, 4)]
    # Features: rank of the first token under the root (none confirmed yet).
    assert [c.feature for c in src.candidates([1], max_tokens=3, limit=4)] == [0, 1, 0, 0]


def test_branch_is_extended_by_its_rank0_child() -> None:
    # 1 -> (2, 5), 5 -> (6,); 2 has no row. Greedy (2,) stops at once; the branch (5,) (0.24) is then
    # extended by 5's rank-0 successor (0.144) into (5, 6), not emitted as a separate (5,).
    src = source([(1, (2, 5)), (5, (6,))])
    assert toks(src.candidates([1], max_tokens=3, limit=2)) == [(2,), (5, 6)]


def test_depth_preferred_over_deep_ranks() -> None:
    # Root 1 -> (2, 3, 4, 5); 2 -> (6,), 6 -> (7,). Greedy (2, 6, 7). Then rank 1 (3,) = 0.24,
    # rank 2 (4,) = 0.096, rank 3 (5,) = 0.0384: best branch points first.
    src = source([(1, (2, 3, 4, 5)), (2, (6,)), (6, (7,))])
    assert toks(src.candidates([1], max_tokens=5, limit=4)) == [(2, 6, 7), (3,), (4,), (5,)]


def test_rank_order_of_alternatives_and_features() -> None:
    # Root 1 with six successors and no further rows: one-token candidates in rank order; the feature
    # is the rank, ranks 4 and beyond share bucket 4.
    src = source([(1, (10, 11, 12, 13, 14, 15))])
    cands = src.candidates([1], max_tokens=1, limit=6)
    assert toks(cands) == [(10,), (11,), (12,), (13,), (14,), (15,)]
    assert [c.feature for c in cands] == [0, 1, 2, 3, 4, 4]


def test_newest_successors_replace_old_row() -> None:
    # 1's row (2, 3) is replaced wholesale by the newer (4, 5): 2 and 3 are gone.
    src = source([(1, (2, 3))])
    learn(src, [(1, (4, 5))])
    assert toks(src.candidates([1], max_tokens=1, limit=4)) == [(4,), (5,)]
    # Within one step the last row for a token wins.
    learn(src, [(1, (6,)), (1, (7, 8))])
    assert toks(src.candidates([1], max_tokens=1, limit=4)) == [(7,), (8,)]


def test_rows_cut_to_top_k_and_deduplicated() -> None:
    # top_k 2: only the first two successors are kept.
    src = source([(1, (2, 3, 4))], top_k=2)
    assert toks(src.candidates([1], max_tokens=1, limit=4)) == [(2,), (3,)]
    # A row with a repeated token (not expected from a real top-k) must not duplicate a path.
    src = source([(1, (2, 2, 3))])
    assert toks(src.candidates([1], max_tokens=1, limit=4)) == [(2,), (3,)]


def test_accepted_successions_promoted() -> None:
    # 7 -> (8, 9). The step appended 9, 8 after root 7 (context ends 7, 9, 8): 9 truly follows 7, so
    # it moves to the front of 7's row, and 8 (truly after 9) becomes 9's row.
    src = source([(7, (8, 9))])
    learn(src, [], context=[1, 7, 9, 8], accepted=[9, 8])
    cands = src.candidates([1, 7], max_tokens=3, limit=4)
    # Greedy from 7: 9 then 8 (8 has no row). Then (8,) at rank 1.
    assert toks(cands) == [(9, 8), (8,)]
    # (9, 8) starts with 7's confirmed successor at rank 0: feature 0 + 5; (8,) is rank 1, unconfirmed;
    # both + 20: 7 was seen after 1, so the root's row is the one keyed by (1, 7).
    assert [c.feature for c in cands] == [25, 21]


def test_accepted_token_missing_from_row_is_inserted() -> None:
    # top_k 2, 7 -> (8, 9); 5 was accepted after 7: inserted first, the row cut back to two: (5, 8).
    src = source([(7, (8, 9))], top_k=2)
    learn(src, [], context=[7, 5], accepted=[5])
    assert toks(src.candidates([7], max_tokens=1, limit=4)) == [(5,), (8,)]


def test_accepted_wins_over_same_step_successors() -> None:
    # In one step a (rejected-branch) row says 7 -> (8, 9) but 9 was accepted after 7: confirmed
    # evidence is applied after the rows, so 9 leads.
    src = RecyclingSource()
    learn(src, [(7, (8, 9))], context=[7, 9], accepted=[9])
    assert toks(src.candidates([7], max_tokens=1, limit=4)) == [(9,), (8,)]


def test_accepted_at_context_start() -> None:
    # The whole context was appended (no token before it): only the pair (3, 4) is known.
    src = RecyclingSource()
    learn(src, [], context=[3, 4], accepted=[3, 4])
    assert toks(src.candidates([3], 4, 4)) == [(4,)]
    assert src.candidates([4], 4, 4) == []


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5, 7])
@pytest.mark.parametrize("limit", [1, 2, 4, 8])
def test_limits_respected_and_no_prefixes(max_tokens: int, limit: int) -> None:
    # Bushy adjacency t -> (t+1, t+2, t+3): the first candidate is the greedy chain 1, 2, 3, ...;
    # at most `limit` candidates of at most `max_tokens` tokens, distinct, none a prefix of another.
    cands = bushy().candidates([0], max_tokens=max_tokens, limit=limit)
    assert cands[0].tokens == tuple(range(1, max_tokens + 1))
    assert_well_formed(cands, max_tokens, limit)
    # The tree has 3 ** max_tokens leaves, so every slot is used (one-token guesses: only 3 exist).
    assert len(cands) == min(limit, 3**max_tokens)


def test_node_budget() -> None:
    # max_nodes 10: the union of the candidates' prefixes (the verified tree) has at most 10 nodes,
    # except that the greedy chain is always whole.
    src = RecyclingSource(max_nodes=10)
    learn(src, [(t, (t + 1, t + 2, t + 3)) for t in range(100)])
    nodes = {c.tokens[:i] for c in src.candidates([0], max_tokens=7, limit=8) for i in range(1, len(c.tokens) + 1)}
    assert len(nodes) == 10
    src = RecyclingSource(max_nodes=2)
    learn(src, [(t, (t + 1, t + 2, t + 3)) for t in range(100)])
    assert toks(src.candidates([0], max_tokens=7, limit=8)) == [(1, 2, 3, 4, 5, 6, 7)]


def test_cycles_bounded_by_max_tokens() -> None:
    # a -> b -> a: the path repeats but stops at max_tokens.
    src = source([(1, (2,)), (2, (1,))])
    assert toks(src.candidates([1], max_tokens=5, limit=4)) == [(2, 1, 2, 1, 2)]
    # A self-loop.
    src = source([(3, (3,))])
    assert toks(src.candidates([3], max_tokens=4, limit=4)) == [(3, 3, 3, 3)]
    # Cycles with alternatives at every node: terminates, and every guess is within the limits.
    src = source([(1, (2, 1)), (2, (1, 2))])
    cands = src.candidates([1], max_tokens=6, limit=5)
    assert cands[0].tokens == (2, 1, 2, 1, 2, 1)
    assert_well_formed(cands, 6, 5)


def test_a_shared_table_hot_starts_the_next_request_and_marks_inherited_rows() -> None:
    # Request one learns 1 -> (2, 3) and 2 -> (4,) into a shared table. Request two, on the same table,
    # guesses from those rows at its very first step, before it has computed any logits itself; its
    # guesses start from an inherited row, so their feature is the rank plus 10.
    table = SuccessorTable()
    first = RecyclingSource(table=table)
    learn(first, [(1, (2, 3)), (2, (4,))])
    assert [c.feature for c in first.candidates([1], max_tokens=2, limit=2)] == [0, 1]  # its own rows
    second = RecyclingSource(table=table)
    cands = second.candidates([1], max_tokens=2, limit=2)
    assert toks(cands) == [(2, 4), (3,)]
    assert [c.feature for c in cands] == [10, 11]
    # Once request two computes 1's successors itself, the row is its own again (and newest wins).
    learn(second, [(1, (3, 2))])
    cands = second.candidates([1], max_tokens=2, limit=2)
    assert toks(cands) == [(3,), (2, 4)] and [c.feature for c in cands] == [0, 1]
    # A token seen to follow the root makes the row its own too (confirmed: + 5).
    third = RecyclingSource(table=table)
    learn(third, [], context=[1, 3], accepted=[3])
    assert [c.feature for c in third.candidates([1], max_tokens=1, limit=1)] == [5]
    assert len(table) == 2


def test_a_table_of_other_width_is_refused() -> None:
    with pytest.raises(ValueError, match="top-8 rows for a source of top_k 4"):
        RecyclingSource(top_k=4, table=SuccessorTable(8))
    with pytest.raises(ValueError, match="top_k must be >= 1"):
        SuccessorTable(0)


def test_rows_keyed_by_the_previous_token() -> None:
    # One step computed token 1 twice: after 7 the model expected (2, 3), after 8 it expected (4, 5).
    # The token's own row keeps the newest, (4, 5); the rows keyed by (7, 1) and (8, 1) keep both. And
    # 2 after 1 was expected to go on to 3, while 2 in another context (after 0) went on to 9.
    src = RecyclingSource()
    src.observe(Observation(context=[0], accepted=[], successors=[(1, (2, 3)), (1, (4, 5)), (2, (3,)), (2, (9,))],
                            predecessors=[(7,), (8,), (1,), (0,)]))
    # After 7, 1: the (7, 1) row, then 2 after 1: the (1, 2) row (3,), not 2's own row (9,). The
    # feature says the root's row is of order 2 (+ 20).
    cands = src.candidates([7, 1], max_tokens=3, limit=2)
    assert toks(cands) == [(2, 3), (3,)] and [c.feature for c in cands] == [20, 21]
    assert toks(src.candidates([8, 1], max_tokens=3, limit=2)) == [(4,), (5,)]
    # After a token no row was written for (6, 1): first order, the token's newest row, no + 20;
    # 4 and 5 have no rows, so the paths end there.
    cands = src.candidates([6, 1], max_tokens=3, limit=2)
    assert toks(cands) == [(4,), (5,)] and [c.feature for c in cands] == [0, 1]
    # A row on no path (an aux row: no tokens before it) writes no keyed row; observations without
    # predecessors (a proposer that does not report them) are first order only.
    src.observe(Observation(context=[0], accepted=[], successors=[(1, (6,))], predecessors=[()]))
    assert toks(src.candidates([6, 1], max_tokens=1, limit=1)) == [(6,)]
    assert toks(src.candidates([7, 1], max_tokens=1, limit=1)) == [(2,)]
    src.observe(Observation(context=[0], accepted=[], successors=[(1, (5,))]))
    assert toks(src.candidates([7, 1], max_tokens=1, limit=1)) == [(2,)]


def test_rows_keyed_by_two_previous_tokens_come_first() -> None:
    # Order 3. 1 after 6, 7 was expected to go on to 2; 1 after 5, 7 to 3 (written later, so the (7, 1)
    # row and 1's own row say 3). After 6, 7, 1 the order-3 row wins (+ 40); after 4, 7, 1 there is
    # none, so the (7, 1) row says 3 (+ 20); after 9, 1 only 1's own row is left (+ 0).
    src = RecyclingSource(table=SuccessorTable(order=3))
    src.observe(Observation(context=[0], accepted=[], successors=[(1, (2,)), (1, (3,))],
                            predecessors=[(6, 7), (5, 7)]))
    assert [(c.tokens, c.feature) for c in src.candidates([6, 7, 1], 1, 1)] == [((2,), 40)]
    assert [(c.tokens, c.feature) for c in src.candidates([4, 7, 1], 1, 1)] == [((3,), 20)]
    assert [(c.tokens, c.feature) for c in src.candidates([9, 1], 1, 1)] == [((3,), 0)]
    # Order 2 (the default): the same rows, keyed by one previous token only.
    two = RecyclingSource()
    two.observe(Observation(context=[0], accepted=[], successors=[(1, (2,)), (1, (3,))],
                            predecessors=[(6, 7), (5, 7)]))
    assert [(c.tokens, c.feature) for c in two.candidates([6, 7, 1], 1, 1)] == [((3,), 20)]


def test_accepted_successions_promoted_in_keyed_rows() -> None:
    # Rows: 7 -> (8, 9) in general. The step appended 9, 8 after root 7, which followed 1, 5 (context
    # ends 1, 5, 7, 9, 8): 9 follows 7 after 5 (and after 1, 5), and 8 follows 9 after 7 (and 5, 7).
    src = RecyclingSource(table=SuccessorTable(order=3))
    learn(src, [(7, (8, 9))])
    learn(src, [], context=[1, 5, 7, 9, 8], accepted=[9, 8])
    contexts = src.table.contexts
    assert contexts[(5, 7)] == contexts[(1, 5, 7)] == (9, 8)  # from 7's row, the observed successor first
    assert contexts[(7, 9)] == contexts[(5, 7, 9)] == (8,)
    # 7 later after 3 was followed by 4: each keyed row keeps its own successor.
    learn(src, [], context=[1, 5, 7, 9, 8, 3, 7, 4], accepted=[7, 4])
    assert contexts[(3, 7)] == (4, 9, 8)
    assert toks(src.candidates([5, 7], max_tokens=2, limit=1)) == [(9, 8)]
    assert toks(src.candidates([3, 7], max_tokens=1, limit=1)) == [(4,)]


def test_keyed_rows_are_bounded_least_recently_written_first() -> None:
    table = SuccessorTable(max_contexts=2)
    table.write_key((1, 2), (3,))
    table.write_key((4, 5), (6,))
    table.write_key((1, 2), (7,))  # rewritten: now the most recent
    table.write_key((8, 9), (10,))  # over the bound: (4, 5) goes
    assert list(table.contexts) == [(1, 2), (8, 9)] and table.contexts[(1, 2)] == (7,)
    assert table.row((4,), 5) == (None, 1) and table.row((1,), 2) == ((7,), 2)
    # max_contexts 0 (or order 1): a row per token only.
    flat = SuccessorTable(max_contexts=0)
    flat.write((1,), 2, (3,))
    assert not flat.contexts and flat.order == 1
    with pytest.raises(ValueError, match="max_contexts must be >= 0"):
        SuccessorTable(max_contexts=-1)
    with pytest.raises(ValueError, match="order must be 1"):
        SuccessorTable(order=4)
