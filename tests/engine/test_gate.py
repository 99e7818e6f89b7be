"""Table tests for the speculation gate: what it admits, and how it scores candidates afterwards.
A fixed step cost (step_cost) pins the decision, so nothing here depends on timings."""

from __future__ import annotations

from lookahead.engine.draft import CandidateTree, Draft
from lookahead.engine.gate import GateConfig, SpeculationGate


def draft(*continuations: tuple[int, ...], source: str = "ctx") -> Draft:
    tree = CandidateTree()
    for c in continuations:
        tree.add(c, source)
    return Draft(tree=tree)


def test_a_candidate_is_scored_by_the_tokens_later_generated_at_its_positions() -> None:
    # step cost r = 1.5: a step speculates when a source's expected accepted tokens exceed r - 1 = 0.5.
    # decay 0.5: each scored candidate moves the source's estimate halfway to its score.
    gate = SpeculationGate(GateConfig(step_cost=1.5, decay=0.5))
    d = draft((1, 2, 3))
    assert gate.admit(d) is d  # prior estimate 1.0 > 0.5: admitted as proposed
    gate.observe([1, 2], query_tokens=4, seconds=0.1)  # 2 tokens so far: (1 2 3) cannot be scored yet
    assert gate.accept == {} and len(gate.pending) == 1
    gate.observe([9], query_tokens=1, seconds=0.1)  # history 1 2 9: the candidate got 2 tokens right
    assert gate.accept == {"ctx": 0.5 * 1.0 + 0.5 * 2}
    assert gate.pending == []


def test_a_source_whose_candidates_miss_is_gated_off_then_scored_anyway() -> None:
    gate = SpeculationGate(GateConfig(step_cost=1.5, decay=0.5))
    gate.admit(draft((1, 2)))
    gate.observe([7, 7], query_tokens=3, seconds=0.1)  # candidate (1 2) got 0 right: 0.5*1 + 0.5*0 = 0.5
    assert gate.accept == {"ctx": 0.5}
    refused = gate.admit(draft((3, 4)))  # 0.5 is not > 0.5: a plain one-token step
    assert len(refused.tree) == 0 and refused.aux is None
    gate.observe([3], query_tokens=1, seconds=0.1)
    gate.observe([4], query_tokens=1, seconds=0.1)  # the refused candidate (3 4) was right: scored 2
    assert gate.accept == {"ctx": 0.5 * 0.5 + 0.5 * 2}
    d = draft((5,))
    assert gate.admit(d) is d  # 1.25 > 0.5: speculating again


def test_the_best_source_decides_and_adaptive_off_admits_everything() -> None:
    gate = SpeculationGate(GateConfig(step_cost=3.0))  # r - 1 = 2: needs an expected 2 accepted tokens
    gate.accept = {"weak": 0.2, "strong": 2.5}
    mixed = draft((1,), source="weak")
    mixed.tree.add((2, 3), "strong")
    assert gate.admit(mixed) is mixed
    assert len(gate.admit(draft((4,), source="weak")).tree) == 0
    off = SpeculationGate(GateConfig(adaptive=False, step_cost=100.0))
    d = draft((4,), source="weak")
    assert off.admit(d) is d
