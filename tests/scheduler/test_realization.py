"""A request's realization (engine/realization.py): scored from unverified steps too, so it cannot trap.

Hand-written cases for the scoring, then the scheduler: a request whose realization was driven down
speculates again once its guesses are right (and never while they are wrong), without changing a token.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

import lookahead
from lookahead.config import GenerationConfig, SamplingConfig
from lookahead.engine.costs import CostCurve
from lookahead.engine.draft import CandidateTree, Draft, StepOutcome
from lookahead.engine.realization import MAX_SHADOWS, Realization, accepted_along
from lookahead.scheduler.request import Request
from lookahead.scheduler.scheduler import Scheduler, SchedulerConfig

from ..engine.helpers import model64


def tree_of(*paths: Sequence[int]) -> CandidateTree:
    tree = CandidateTree()
    for path in paths:
        tree.add(path, probs=[0.5 ** (d + 1) for d in range(len(path))])
    return tree


def test_accepted_along_follows_the_tokens_through_the_chosen_nodes() -> None:
    # nodes: 0:[7] 1:[7,8] 2:[7,8,9] 3:[7,5] 4:[6]
    tree = tree_of([7, 8, 9], [7, 5], [6])
    every = frozenset(range(5))
    assert accepted_along(tree, every, [7, 8, 9]) == 3  # the whole first chain
    assert accepted_along(tree, every, [7, 5, 1]) == 2  # the branch off node 0, then nothing deeper
    assert accepted_along(tree, every, [6, 6]) == 1  # the other root child
    assert accepted_along(tree, every, [3, 7]) == 0  # the first token is wrong: nothing after it counts
    # a node the step would not have verified stops the run, though the tokens follow the tree on
    assert accepted_along(tree, frozenset({0, 3}), [7, 8, 9]) == 1
    assert accepted_along(tree, frozenset({1, 2}), [7, 8, 9]) == 0  # its parent 0 not verified


def test_a_shadow_is_scored_once_its_tokens_exist() -> None:
    r = Realization(prior=1.0, decay=0.5)
    tree = tree_of([7, 8, 9])  # probs 0.5, 0.25, 0.125
    r.shadow(position=3, tree=tree, nodes=[0, 1, 2])  # guesses context[3:6]
    r.resolve([1, 2, 3, 7, 8])  # one token short of the deepest node
    assert (r.promised, r.realized, r.pending) == (1.0, 1.0, 1)
    r.resolve([1, 2, 3, 7, 8, 4])  # 7, 8 right, 9 wrong: 2 accepted for 0.875 promised
    assert r.pending == 0
    assert r.promised == pytest.approx(0.5 * 1.0 + 0.875)
    assert r.realized == pytest.approx(0.5 * 1.0 + 2)
    r.resolve([1, 2, 3, 7, 8, 4, 5, 6])  # scored once only
    assert r.promised == pytest.approx(1.375)


def test_shadows_lift_a_trapped_ratio_only_when_they_come_true() -> None:
    right, wrong = Realization(), Realization()
    for r in (right, wrong):
        r.record(promised=30.0, accepted=0)  # early misses: the ratio falls near 0
    assert right.ratio < 0.05
    context = [1, 2, 3]
    for step in range(20):  # one-token steps: each shadow guesses the next two tokens
        token = 10 + step
        right.shadow(len(context), tree_of([token, token + 1]), [0, 1])
        wrong.shadow(len(context), tree_of([token + 50, token + 1]), [0, 1])
        context.append(token)
        right.resolve(context)
        wrong.resolve(context)
    assert right.ratio > 0.9  # 2 accepted for 0.75 promised: it caps at 1 once the misses have decayed
    assert wrong.ratio < 0.05
    assert right.pending == wrong.pending == 1  # the last step's second token is still to come


def test_shadows_kept_are_bounded() -> None:
    r = Realization()
    for i in range(MAX_SHADOWS + 5):
        r.shadow(100, tree_of([1, 2]), [0, 1])
    assert r.pending == MAX_SHADOWS
    r.shadow(100, tree_of([1]), [])  # no nodes: nothing to score
    assert r.pending == MAX_SHADOWS


def test_realization_config_checked() -> None:
    with pytest.raises(ValueError, match="decay"):
        Realization(decay=1.0)


class Oracle:
    """Guesses the next `depth` tokens of `reference` after the prompt (or, `wrong`, other tokens), with
    calibrated path probabilities, so the allocator sizes the step (engine/allocator.py)."""

    def __init__(self, prompt: Sequence[int], reference: Sequence[int], vocab: int, wrong: bool = False,
                 depth: int = 4) -> None:
        self.full, self.start, self.vocab, self.wrong, self.depth = list(prompt) + list(reference), len(prompt), vocab, wrong, depth

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        pos = len(context)
        guess = self.full[pos : pos + min(self.depth, budget)]
        if self.wrong:
            guess = [(t + 1) % self.vocab for t in guess]
        tree = CandidateTree()
        if guess:
            tree.add(guess, probs=[0.8 ** (d + 1) for d in range(len(guess))])
        return Draft(tree=tree, calibrated=True)

    def update(self, context: Sequence[int], outcome: StepOutcome) -> None:
        pass


# a curve on which a one-row step pays unless the guesses are worth something: speculation is a choice
STEEP = CostCurve({1: 1.0, 2: 1.4, 4: 1.8, 8: 2.6}, learns=False)


def trapped_run(sampling: SamplingConfig, wrong: bool) -> tuple[list[int], list[int], int]:
    """Decode one request whose realization starts trapped (0.02) with an oracle proposer; returns its
    tokens, the reference (the request decoded autoregressively) and its speculative steps."""
    lm = model64("llama")
    prompt = lm.encode("one two three one two three one", raw=True)
    reference = lookahead.generate(lm, prompt, max_new_tokens=30, strategy="autoregressive", sampling=sampling).token_ids
    vocab = lm.model.get_output_embeddings().weight.shape[0]
    scheduler = Scheduler(lm, SchedulerConfig(max_batch=1, exact=False))
    scheduler.curve = STEEP
    request = Request(lm, prompt, GenerationConfig(max_new_tokens=30, strategy="lookahead", sampling=sampling))
    request.proposer = Oracle(prompt, reference, vocab, wrong)
    request._realization.record(promised=50.0, accepted=0)  # as after early misses: ratio 0.02
    scheduler.add(request)
    result = None
    while scheduler.active:
        for _, event in scheduler.step():
            result = event.result or result
    assert result is not None
    return result.token_ids, reference, result.stats.speculative_steps


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=0.9, top_p=0.95, seed=7)],
                         ids=["greedy", "sampled"])
def test_a_trapped_request_speculates_again_once_its_guesses_are_right(sampling: SamplingConfig) -> None:
    tokens, reference, speculative = trapped_run(sampling, wrong=False)
    assert tokens == reference
    assert speculative >= 3  # a few shadowed steps, then chains of the oracle verified (5 steps here)


def test_a_trapped_request_whose_guesses_stay_wrong_never_pays_for_them() -> None:
    tokens, reference, speculative = trapped_run(SamplingConfig(), wrong=True)
    assert tokens == reference
    assert speculative == 0


def test_without_shadows_the_trap_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    # the behaviour the shadows fix: scored only from verified steps, the ratio never recovers
    monkeypatch.setattr(Request, "shadow", lambda self, nodes: None)
    tokens, reference, speculative = trapped_run(SamplingConfig(), wrong=False)
    assert tokens == reference
    assert speculative == 0
