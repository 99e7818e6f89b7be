"""Hand-written cases for the allocator (engine/allocator.py) and the cost curve it reads
(engine/costs.py). Each case spells out E[tokens] / cost for the allocations that compete."""

from __future__ import annotations

import random

import pytest

from lookahead.engine.allocator import Candidates, allocate, allocate_batch, chain_first
from lookahead.engine.costs import CostCurve, Price, curve_from
from lookahead.engine.draft import CandidateTree


def tree_of(*paths: tuple[tuple[int, ...], tuple[float, ...]]) -> CandidateTree:
    tree = CandidateTree()
    for tokens, probs in paths:
        tree.add(tokens, "s", probs)
    return tree


# A CPU-like curve: the second row costs 40% more, later rows little (float32 on the 2-core CPU).
CPU = CostCurve({1: 1.0, 2: 1.4, 4: 1.45, 8: 1.5, 16: 1.7, 32: 2.4})


def test_nothing_pays_gives_the_empty_allocation() -> None:
    # One guess at p = 0.3: 1.3 tokens for 1.4 units (0.93/unit) loses to a plain step (1.0/unit).
    tree = tree_of(((5,), (0.3,)))
    plan = allocate(tree, tree.probs, CPU)
    assert plan.nodes == () and plan.width == 1 and not plan.aux
    # At p = 0.5 it pays: 1.5 / 1.4 = 1.07 per unit.
    tree = tree_of(((5,), (0.5,)))
    assert allocate(tree, tree.probs, CPU).nodes == (0,)


def test_a_flat_curve_fills_up_to_the_widest_step() -> None:
    # Every width costs the same: every node with p > 0 is worth verifying, up to max_width rows.
    tree = tree_of(((1, 2, 3), (0.2, 0.1, 0.05)), ((4, 5), (0.1, 0.01)), ((6,), (0.001,)))
    plan = allocate(tree, tree.probs, CostCurve.flat())
    assert sorted(plan.nodes) == list(range(6))
    assert plan.width == 7
    assert allocate(tree, tree.probs, CostCurve.flat(), max_width=4).nodes == (0, 3, 1)  # the 3 likeliest


def test_rows_below_the_width_floor_are_free() -> None:
    # The curve of a steep device, but passes are padded to 2 rows: the first guess costs nothing more,
    # however unlikely (1.05 / 1.4 beats 1 / 1.4); a second one (3 rows: 1.425 units) would need
    # p > 1.05 * (1.425 / 1.4 - 1) = 0.019 to pay, and has 0.01.
    floored = CostCurve({1: 1.0, 2: 1.4, 4: 1.45, 8: 1.5}, floor=2)
    tree = tree_of(((7,), (0.05,)), ((8,), (0.01,)))
    assert allocate(tree, tree.probs, floored).nodes == (0,)


def test_the_knee_bounds_the_allocation() -> None:
    # Ten independent guesses at p = 0.3 each on the CPU curve: rows 2..8 are cheap (1.4 -> 1.5 units),
    # rows past 8 cost 0.025 per row up to 16 and 0.044 per row after that.
    tree = tree_of(*[((t,), (0.3,)) for t in range(10)])
    plan = allocate(tree, tree.probs, CPU)
    # 7 guesses: (1 + 2.1) / 1.5 = 2.07/unit; 10 guesses: (1 + 3.0) / 1.575 = 2.54 -> more is better here
    assert len(plan.nodes) == 10
    # with guesses at p = 0.02 the extra rows past the free floor of the curve do not pay
    weak = tree_of(*[((t,), (0.02,)) for t in range(10)])
    assert allocate(weak, weak.probs, CPU).nodes == ()


def test_chain_only_verifies_one_path_its_best_prefix() -> None:
    # Two branches: (1 2 3) with path probabilities 0.9 0.8 0.1 and (4) with 0.6. On a flat curve a
    # tree would take all four nodes; chain_only takes the best single path, (1 2 3), all of it.
    tree = tree_of(((1, 2, 3), (0.9, 0.8, 0.1)), ((4,), (0.6,)))
    assert sorted(allocate(tree, tree.probs, CostCurve.flat()).nodes) == [0, 1, 2, 3]
    plan = allocate(tree, tree.probs, CostCurve.flat(), chain_only=True)
    assert plan.nodes == (0, 1, 2)
    # On the CPU curve a third node of p 0.01 costs more than it brings: (1 + 1.7) / 1.425 = 1.89 vs
    # (1 + 1.71) / 1.45 = 1.87; at p 0.1 it pays: (1 + 1.8) / 1.45 = 1.93
    assert allocate(tree, tree.probs, CPU, chain_only=True).nodes == (0, 1, 2)
    tree = tree_of(((1, 2, 3), (0.9, 0.8, 0.01)), ((4,), (0.6,)))
    assert allocate(tree, tree.probs, CPU, chain_only=True).nodes == (0, 1)


def _random_tree(rng: random.Random) -> CandidateTree:
    """Up to 6 continuations of 1-5 tokens over a 4-token vocabulary (so they share prefixes), each
    token's path probability its parent's times a uniform draw."""
    tree = CandidateTree()
    for _ in range(rng.randint(1, 6)):
        n = rng.randint(1, 5)
        tokens = tuple(rng.randint(0, 3) for _ in range(n))
        probs, p = [], 1.0
        for _ in range(n):
            p *= rng.random()
            probs.append(p)
        tree.add(tokens, "s", probs)
    return tree


def _subtrees(tree: CandidateTree) -> list[tuple[int, ...]]:
    """Every set of nodes closed under parents (the root alone included), by brute force."""
    out = []
    for mask in range(1 << len(tree)):
        nodes = tuple(i for i in range(len(tree)) if mask >> i & 1)
        if all(tree.parents[i] < 0 or mask >> tree.parents[i] & 1 for i in nodes):
            out.append(nodes)
    return out


def _is_chain(tree: CandidateTree, nodes: tuple[int, ...]) -> bool:
    depths = [tree.depths[i] for i in nodes]
    return len(set(depths)) == len(depths)


def test_parents_always_come_before_their_children() -> None:
    rng = random.Random(0)
    for _ in range(200):
        tree = _random_tree(rng)
        plan = allocate(tree, tree.probs, CPU)
        chosen: set[int] = set()
        for node in plan.nodes:
            assert tree.parents[node] == -1 or tree.parents[node] in chosen
            chosen.add(node)
        tree.subtree(plan.nodes)  # builds: every parent present


def test_the_allocation_is_the_best_of_every_subtree_by_brute_force() -> None:
    # The slow, obvious reference: price every parent-closed node set (every chain, with chain_only) with
    # and without the aux branch, within max_width rows, and keep the most expected tokens per unit cost.
    # The allocator must reach that rate (ties may pick another set of the same worth).
    rng = random.Random(7)
    curves = [CPU, CostCurve({1: 1.0, 3: 0.9, 4: 1.1, 8: 1.15, 9: 1.5, 16: 1.8}), CostCurve.flat()]
    for case in range(300):
        tree = _random_tree(rng)
        if len(tree) > 12:
            continue
        curve, chain_only = curves[case % 3], case % 2 == 1
        max_width = rng.randint(1, 10)
        aux_rows, aux_value = (3, rng.random()) if case % 5 == 0 else (0, 0.0)
        best = 0.0
        for nodes in _subtrees(tree):
            if chain_only and not _is_chain(tree, nodes):
                continue
            for aux in (False, True) if aux_rows else (False,):
                width = 1 + len(nodes) + (aux_rows if aux else 0)
                if width <= max_width:
                    expected = 1.0 + sum(tree.probs[i] for i in nodes) + (aux_value if aux else 0.0)
                    best = max(best, expected / curve(width))
        plan = allocate(tree, tree.probs, curve, aux_rows=aux_rows, aux_value=aux_value, chain_only=chain_only,
                        max_width=max_width)
        assert plan.rate == pytest.approx(best, rel=1e-9), (case, plan)
        assert plan.width <= max_width and plan.width == 1 + len(plan.nodes) + (aux_rows if plan.aux else 0)
        assert plan.expected == pytest.approx(1.0 + sum(tree.probs[i] for i in plan.nodes) + (aux_value if plan.aux else 0.0))
        assert not chain_only or _is_chain(tree, plan.nodes)


def test_more_probable_guesses_never_get_fewer_rows() -> None:
    # Scaling every probability up never shrinks the allocation, on a concave curve.
    rng = random.Random(1)
    for _ in range(100):
        base = [rng.random() * 0.5 for _ in range(8)]
        sizes = []
        for scale in (0.2, 0.5, 1.0, 1.5, 2.0):
            tree = tree_of(*[((t,), (min(p * scale, 1.0),)) for t, p in enumerate(base)])
            sizes.append(len(allocate(tree, tree.probs, CPU).nodes))
        assert sizes == sorted(sizes), sizes


def test_the_aux_branch_runs_only_when_its_worth_beats_its_rows() -> None:
    tree = tree_of(((1,), (0.6,)))
    # 3 aux rows worth 0.05 tokens: 1.6 / 1.4 = 1.14 (no aux) beats 1.65 / 1.4625 = 1.13 (with aux)
    assert not allocate(tree, tree.probs, CPU, aux_rows=3, aux_value=0.05).aux
    # worth 0.5 tokens: 2.1 / 1.4625 = 1.44 beats 1.6 / 1.4 = 1.14
    plan = allocate(tree, tree.probs, CPU, aux_rows=3, aux_value=0.5)
    assert plan.aux and plan.nodes == (0,) and plan.width == 5


def test_cost_curve_interpolates_extrapolates_and_refines() -> None:
    curve = CostCurve({1: 0.02, 2: 0.03, 4: 0.035})  # seconds: stored relative to one row
    assert curve(1) == 1.0 and curve(2) == 1.5 and curve(3) == pytest.approx(1.625)
    assert curve(6) == pytest.approx(1.75 + 2 * 0.125)  # the last segment's slope carries on
    floored = CostCurve({1: 1.0, 2: 1.5, 4: 1.75}, floor=2)
    assert floored(1) == floored(2) == 1.5
    # Observed steps at width 4 run twice as long, relative to width 1, as the curve says: it learns that.
    for _ in range(60):
        curve.observe(1, 0.02)
        curve.observe(4, 0.07)
    assert curve(4) / curve(1) == pytest.approx(3.5, rel=0.05)
    assert curve.seconds_per_unit is not None
    with pytest.raises(ValueError):
        CostCurve({2: 1.0})


def test_a_width_never_timed_costs_at_most_the_line_between_timed_ones() -> None:
    # stored: 6 rows at 1.6 one-row passes, more than 8 (a noisy or stale measurement, or a real bump)
    curve = CostCurve({1: 1.0, 4: 1.2, 6: 1.6, 8: 1.5, 16: 2.5})

    def own(k: int) -> float:  # a width's own price (curve(k) alone pads to a cheaper wider width)
        return curve(k, most=k)

    assert own(6) == pytest.approx(1.6) and curve(6) == pytest.approx(1.5)  # nothing timed yet: as stored
    for _ in range(5):  # 4 and 8 rows timed at just what the curve says (t(1) = 10 ms)
        curve.observe(4, 0.012)
        curve.observe(8, 0.015)
    # 6 rows were never timed: at most the line from 4 (1.2) to 8 (1.5); 5 and 7 likewise (both under it)
    assert own(6) == pytest.approx(1.35) and own(7) == pytest.approx(1.425) and own(5) == pytest.approx(1.275)
    assert curve.pad_to(6) == 6  # so 6 rows now run as 6, not padded to 8, and get timed
    # below the lowest and above the highest timed width: no line to lean on, as stored
    assert own(2) == pytest.approx(1 + 0.2 / 3) and own(12) == pytest.approx(2.0)
    # 6 rows timed as slow as stored: its own timings win (a real bump stays)
    for _ in range(3):
        curve.observe(6, 0.016)
    assert own(6) == pytest.approx(1.6, rel=0.02)
    # the views passes' widths are their own: none of them was timed
    assert curve.with_views(7, most=7) == pytest.approx(1.55)


def test_a_width_never_timed_is_not_priced_below_a_narrower_timed_one() -> None:
    # 4 rows timed a little cheaper than 1 (noise): the line from 1 to 4 would price 2 rows under one row,
    # and a one-row step would move to an untimed width on that guess; 2 rows cost at least what 1 does
    curve = CostCurve({1: 1.0, 2: 1.05, 4: 1.1})
    for _ in range(10):
        curve.observe(1, 0.0100)
        curve.observe(4, 0.0098)
    assert curve(4, most=4) < curve(1, most=1)  # so far the timings
    assert curve(2, most=2) == pytest.approx(curve(1, most=1))  # not the line's 0.99: at least one row's cost
    assert curve.pad_to(1, 2) == 1 and curve.pad_to(1) == 4  # within 2 rows one row stays one; unlimited, the timed 4


def test_a_widths_first_timed_steps_move_its_cost() -> None:
    # 8 rows stored at 1.5 one-row passes, really 1.2: one timed step moves it a third of the way (the
    # stored curve weighs two steps), three steps most of the way; many steps all the way
    curve = CostCurve({1: 1.0, 8: 1.5})
    for _ in range(30):
        curve.observe(1, 0.010)
    curve.observe(8, 0.012)
    assert curve(8) / curve(1) == pytest.approx(1.5 - 0.3 / 3, rel=0.01)
    curve.observe(8, 0.012)
    curve.observe(8, 0.012)
    assert curve(8) / curve(1) < 1.35
    for _ in range(60):
        curve.observe(1, 0.010)
        curve.observe(8, 0.012)
    assert curve(8) / curve(1) == pytest.approx(1.2, rel=0.02)


def test_a_pass_is_padded_to_a_cheaper_wider_width() -> None:
    # float32 MKL on a 2-core CPU: 8 rows cost less than 4 (measured 1.86 vs 2.0 one-row passes), so
    # 3..7 rows run as 8 (dummy rows are free to add) and cost what 8 cost; 2 rows stay 2.
    curve = CostCurve({1: 1.0, 2: 1.78, 3: 2.2, 4: 2.0, 8: 1.86, 16: 2.34})
    assert [curve.pad_to(k) for k in (1, 2, 3, 4, 7, 8, 9, 16)] == [1, 2, 8, 8, 8, 8, 9, 16]
    assert curve(3) == curve(8) == pytest.approx(1.86)
    # the allocator sees the padded cost: 6 guesses at p = 0.2 (2.2 tokens / 1.86 = 1.18) beat none (1.0)
    tree = tree_of(*[((t,), (0.2,)) for t in range(6)])
    assert len(allocate(tree, tree.probs, curve).nodes) == 6


def test_padding_stops_at_a_limit() -> None:
    # bfloat16 oneDNN on a 2-core Zen 4: 3 rows cost 0.88 of one, 4 rows 0.89, 8 rows 1.03 (12 made cheap
    # here). Unlimited, one row runs as 3 and 5 rows (0.91, interpolated) as 12; within at most 2 rows one
    # row stays 1 (2 cost more); within 8, 5 rows stay 5: the limit never pads to a costlier width (8).
    curve = CostCurve({1: 1.0, 2: 1.02, 3: 0.88, 4: 0.89, 6: 0.93, 8: 1.03, 12: 0.9})
    assert [curve.pad_to(k) for k in (1, 2, 4, 5, 9)] == [3, 3, 4, 12, 12]
    assert [curve.pad_to(k, 2) for k in (1, 2, 4)] == [1, 2, 4]  # nothing cheaper within 2; 4 > 2 runs as is
    assert [curve.pad_to(k, 4) for k in (1, 2, 3)] == [3, 3, 3]  # the cheapest within 4: 3
    assert [curve.pad_to(k, 8) for k in (5, 6, 7)] == [5, 6, 7]
    assert curve.pad_to(5, 12) == 12
    # and a width is priced as it runs within the limit: one row alone within 2, as 3 rows without one
    assert (curve(1, 2), curve(1), curve(5, 8)) == (1.0, 0.88, pytest.approx(0.91))


def test_padding_follows_the_refined_curve() -> None:
    # pad_to keeps the cheapest wider width from one sweep per refinement; after each observed step it
    # must still pick what a search over every wider measured width picks (the cheapest, narrowest on ties).
    curve = CostCurve({1: 1.0, 2: 1.78, 3: 2.2, 4: 2.0, 8: 1.86, 16: 2.34})

    def searched(k: int) -> int:
        wider = [w for w in curve.widths if w > k]
        price = curve._cost  # a width's own price, before padding
        best = min(wider, key=lambda w: (price(w), w), default=k)
        return best if wider and price(best) < price(k) else k

    assert curve.pad_to(3) == 8
    # 8-row passes turn out slow (3x what the curve says), 4-row passes fast: 3 rows now run as 4
    for width, seconds in [(1, 0.01), (8, 0.056), (4, 0.012)] * 40:
        curve.observe(width, seconds)
        assert all(curve.pad_to(k) == searched(k) for k in range(1, 20))
    # 3 rows were never timed: between the observed 1 and 4 they are priced at most on the line between
    # those (the stored 2.2 may be stale), so 3 rows run as 3 and get timed; where they turn out as slow
    # as stored (2.2 one-row passes), 3 rows run as 4 again
    assert curve.pad_to(3) == 3 and curve.pad_to(5) == 5
    for _ in range(3):
        curve.observe(3, 0.022)
        assert all(curve.pad_to(k) == searched(k) for k in range(1, 20))
    assert curve.pad_to(3) == 4


def test_a_sweep_prices_every_width_as_one_at_a_time_does() -> None:
    # Price.many (one sweep per step) against pad_to and the curve per width: dips, a floor, limits below,
    # inside and past the measured widths, before and after observed steps (widths between observed ones
    # priced on the line between them), with and without key views.
    curves = [CostCurve({1: 1.0, 2: 1.02, 3: 0.88, 4: 0.89, 6: 0.93, 8: 1.03, 12: 0.9}),
              CostCurve({1: 1.0, 2: 1.78, 3: 2.2, 4: 2.0, 8: 1.86, 16: 2.34}, floor=2, views=0.3),
              CostCurve({1: 1.0, 8: 1.0, 16: 2.0, 32: 4.0}, floor=4)]
    for curve in curves:
        for observed in ([], [(1, 0.01), (8, 0.056), (4, 0.012), (5, 0.03)] * 3):
            for width, seconds in observed:
                curve.observe(width, seconds)
            for most in (None, 1, 2, 4, 5, 8, 12, 40):
                widths = list(range(1, 41))
                assert curve.padded(widths, most) == [curve.pad_to(w, most) for w in widths]
                assert Price(curve, most).many(widths) == [curve(w, most) for w in widths]
                assert Price(curve, most, views=True).many(widths) == [curve.with_views(w, most) for w in widths]
                assert [Price(curve, most)(w) for w in widths] == [curve(w, most) for w in widths]


# -- one budget across a batch (allocate_batch) ---------------------------------------------------
# A device whose passes cost the same up to 8 rows, then grow linearly: c(16) = 2, c(32) = 4.
KNEE8 = CostCurve({1: 1.0, 8: 1.0, 16: 2.0, 32: 4.0})


def test_a_lone_request_speculates_where_a_full_batch_does_not() -> None:
    guess = tree_of(((5,), (0.5,)))
    # alone: 1.5 tokens for the price of 1 (2 rows are below the knee) -> verify the guess
    assert allocate_batch([Candidates(guess, guess.probs)], KNEE8)[0].nodes == (0,)
    # 16 requests each with that guess: roots only = 16 tokens / c(16) = 8 per unit; with the guesses
    # 32 rows = 24 tokens / c(32) = 6 per unit -> plain batched decoding
    plans = allocate_batch([Candidates(guess, guess.probs)] * 16, KNEE8)
    assert all(p.nodes == () for p in plans)
    # 4 requests: 8 rows cost what 4 do, so every guess is verified (6 tokens / 1 unit vs 4 / 1)
    assert all(p.nodes == (0,) for p in allocate_batch([Candidates(guess, guess.probs)] * 4, KNEE8))


def test_a_batch_shares_one_width_and_each_request_fills_it_with_its_best_nodes() -> None:
    # On a flat curve every row is free: the widest request sets the width (4 rows), and each request
    # fills it with its most probable nodes.
    deep = tree_of(((1, 2, 3, 4, 5), (0.9, 0.8, 0.7, 0.6, 0.5)))
    wide = tree_of(*[((t,), (0.1 * t,)) for t in range(1, 6)])
    plans = allocate_batch([Candidates(deep, deep.probs, max_width=4), Candidates(wide, wide.probs, max_width=4)],
                           CostCurve.flat())
    assert plans[0].nodes == (0, 1, 2)
    assert plans[1].nodes == (4, 3, 2)  # the three likeliest of five single guesses
    assert plans[0].cost == plans[1].cost  # one pass, one cost


def test_the_row_budget_caps_speculation_but_never_a_root() -> None:
    guess = tree_of(((5,), (0.9,)))
    plans = allocate_batch([Candidates(guess, guess.probs)] * 4, CostCurve.flat(), max_rows=4)
    assert all(p.nodes == () and p.width == 1 for p in plans)
    plans = allocate_batch([Candidates(guess, guess.probs)] * 4, CostCurve.flat(), max_rows=8)
    assert all(p.nodes == (0,) for p in plans)


def test_a_request_run_as_proposed_sets_the_batch_width() -> None:
    # An unsized draft (fixed at 3 rows) forces width 3; the other request may use those rows for free.
    fixed = tree_of(((1, 2), (1.0, 1.0)))
    other = tree_of(((7, 8), (0.2, 0.1)))
    plans = allocate_batch([Candidates(fixed, fixed.probs, fixed=3), Candidates(other, other.probs)], KNEE8)
    assert plans[0].nodes == (0, 1) and plans[0].width == 3
    assert plans[1].nodes == (0, 1)


# -- branches over key views: a surcharge per pass (engine/attention.py KeyView) -------------------
# Flat to 8 rows; a pass that verifies any branch off its first chain costs 0.25 more.
VIEWS = CostCurve({1: 1.0, 8: 1.0, 16: 2.0}, views=0.25)


def test_a_branch_is_verified_only_where_it_pays_the_views_surcharge() -> None:
    # Chain (1 2) at 0.6/0.5 plus a sibling (3) at 0.2. The chain alone: 2.1 tokens / 1.0 = 2.1 per
    # unit. With the sibling: 2.3 / 1.25 = 1.84. So the chain.
    tree = tree_of(((1, 2), (0.6, 0.5)), ((3,), (0.2,)))
    plan = allocate(tree, tree.probs, VIEWS, views_cost=VIEWS.with_views)
    assert plan.nodes == (0, 1) and not plan.branches and plan.cost == 1.0
    # A sibling at 0.9 makes it pay: 3.0 / 1.25 = 2.4 > 2.1 (sibling first: it is likelier than node 1).
    rich = tree_of(((1, 2), (0.6, 0.5)), ((3,), (0.9,)))
    plan = allocate(rich, rich.probs, VIEWS, views_cost=VIEWS.with_views)
    assert sorted(plan.nodes) == [0, 1, 2] and plan.branches and plan.cost == pytest.approx(1.25)
    # Without a surcharge (passes that need no views: unpadded, or gap-invariant rows) the tree is free.
    plan = allocate(tree, tree.probs, VIEWS)
    assert sorted(plan.nodes) == [0, 1, 2] and plan.branches and plan.cost == 1.0


def test_branches_priced_as_views_stay_within_two_chains() -> None:
    # Nodes 0:(1) 0.9, 1:(1 4) 0.6, 2:(2) 0.8, 3:(3) 0.7. One chain at best: (1 4), 2.5 tokens / 1.0.
    # With views, at most two chains (one view; each further view would gather the cached prefix
    # again): (1 4) and (2): 3.3 / 1.25 = 2.64 beats 2.5; (3) would start a third chain, left out.
    tree = tree_of(((1, 4), (0.9, 0.6)), ((2,), (0.8,)), ((3,), (0.7,)))
    plan = allocate(tree, tree.probs, VIEWS, views_cost=VIEWS.with_views)
    assert sorted(plan.nodes) == [0, 1, 2] and plan.expected == pytest.approx(3.3)
    # where branches need no views, the whole tree: 4.0 tokens for 1.0
    assert sorted(allocate(tree, tree.probs, VIEWS).nodes) == [0, 1, 2, 3]


def test_one_branching_request_makes_the_whole_batch_pass_pay_the_surcharge() -> None:
    # A's sibling at 0.9 pays for the views alone (above). Batched with B = (7 8) at 0.1/0.05, the pass
    # of chains yields 2.1 + 1.15 = 3.25 per unit; with A's branch 3.0 + 1.15 = 4.15 / 1.25 = 3.32:
    # branch. B stays one chain, but it shares the pass, so it reports the surcharged cost too.
    a = tree_of(((1, 2), (0.6, 0.5)), ((3,), (0.9,)))
    b = tree_of(((7, 8), (0.1, 0.05)))
    plans = allocate_batch([Candidates(a, a.probs), Candidates(b, b.probs)], VIEWS, views_cost=VIEWS.with_views)
    assert plans[0].branches and sorted(plans[0].nodes) == [0, 1, 2]
    assert plans[1].nodes == (0, 1) and not plans[1].branches
    assert plans[0].cost == plans[1].cost == pytest.approx(1.25)
    # With B at 0.5/0.4 the surcharge buys less of the batch's yield: chains 2.1 + 1.9 = 4.0 per unit,
    # branch (3.0 + 1.9) / 1.25 = 3.92. The batch declines the views A would take alone.
    b = tree_of(((7, 8), (0.5, 0.4)))
    plans = allocate_batch([Candidates(a, a.probs), Candidates(b, b.probs)], VIEWS, views_cost=VIEWS.with_views)
    assert plans[0].nodes == (0, 1) and not any(p.branches for p in plans) and plans[0].cost == 1.0


def test_chain_first_puts_the_likeliest_path_first() -> None:
    # Nodes by probability: 0:(1) 0.9, 1:(1 2) 0.3, 2:(1 4) 0.5, 3:(5) 0.2. From the root the likeliest
    # child is node 0, then its likeliest child node 2 (0.5 > 0.3): path [0, 2], then the rest in order.
    tree = tree_of(((1, 2), (0.9, 0.3)), ((1, 4), (0.9, 0.5)), ((5,), (0.2,)))
    assert chain_first(tree, [0, 2, 1, 3]) == [0, 2, 1, 3]
    assert chain_first(tree, [0, 1, 2, 3]) == [0, 2, 1, 3]
    # only chosen nodes count: without node 2 the path is [0, 1]
    assert chain_first(tree, [0, 1, 3]) == [0, 1, 3]
    assert tree.subtree(chain_first(tree, [0, 1, 2, 3])).first_chain().tokens == [1, 4]


def test_the_views_surcharge_is_stored_measured_and_refined() -> None:
    curve = CostCurve({1: 1.0, 8: 1.2}, views=0.3)
    assert curve.with_views(8) == pytest.approx(1.5)
    again = CostCurve.from_json(curve.to_json())
    assert again.views == pytest.approx(0.3) and again(8) == pytest.approx(1.2)
    # measured (seconds): a views pass took 0.006 s more than a chain of its width: 0.6 one-row passes
    measured = curve_from({1: 0.01, 8: 0.012, "views": 0.006})
    assert measured.views == pytest.approx(0.6) and measured(8) == pytest.approx(1.2)
    assert curve_from({1: 0.01, 8: 0.012, "views": -0.001}).views == 0.0  # noise below 0: none
    # views passes observed at twice the predicted cost: the views cost learns it, the plain one not
    for _ in range(60):
        curve.observe(8, 0.012)
        curve.observe(8, 0.030, views=True)
    assert curve.with_views(8) / curve(8) == pytest.approx(2.5, rel=0.05)
    with pytest.raises(ValueError):
        CostCurve({1: 1.0}, views=-0.1)
