"""Several free sources behind one Proposer: their guesses, calibrated, merged into one tree.

Each step:
    1. every source offers up to `per_source` guesses of at most `max_tokens` tokens;
    2. each guess gets calibrated path probabilities (engine/calibration.py), each token's rate scaled
       for the model's own confidence in it where the steps report the model's top-k rows
       (candidates/confidence.py), and every guess offered is tracked, so that it is scored against the
       text generated at its positions whether or not it is verified;
    3. the guesses are merged into one trie, the most valuable guess first (so that the tree's first
       chain is the best single chain, which is all an exact step verifies on some devices), and each
       distinct first token's subtree is scaled by a factor learned for its rank among them (and, with
       CalibrationConfig.agreement, for whether more than one source proposed it): the sources' rates
       are marginal, and where they disagree on the next token at most one is right (measured before
       this correction on sampled text, float32: steps the calibration valued at 0.7-1.1 extra tokens
       realised 0.29-0.35), while a token two sources reached independently looked likelier than either
       says (prompts a-f, SmolLM2 bf16: first tokens of one source right 9% of the time where priced at
       13%, those of several 39-44% where priced at 26-40%, except suffix + jacobi), though correcting
       for it did not pay (docs/measurements.md, "Measured: depth backoff in the calibrator"); below the first token,
       siblings are disjoint events too (at most one continues the text), so a node's children are
       capped to sum to at most its own probability, the likeliest keeping theirs
       (`CandidateTree.cap_siblings`);
    4. an aux-branch source (the Jacobi window) adds its rows and the tokens it is expected to earn.
The generation loop then sizes the step with the allocator (engine/allocator.py). After the step every
source sees the outcome (engine/sources.Observation).

The aux branch's worth: the tokens its n-grams got accepted per step while it ran (an EMA). While it
does not run that estimate is not refreshed, so it drifts back to the optimistic prior over
`explore_every` steps and the window gets tried again. (A batched step runs no window at all:
lookahead/scheduler/request.py.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lookahead.candidates.confidence import ModelConfidence
from lookahead.engine.calibration import Calibrator
from lookahead.engine.draft import CandidateTree, Draft, StepOutcome
from lookahead.engine.sources import (Candidate, CandidateSource, Observation, RunsAuxBranch, WantsStates,
                                      WantsSuccessors)


@dataclass(frozen=True)
class PoolConfig:
    """max_tokens: longest guess; per_source: guesses asked of each source per step; allocate: let the
    allocator size each step (False: verify every guess and run the aux branch every step, as proposed);
    explore_every: steps after which an idle aux branch is worth its prior again; aux_prior: that prior
    (tokens per step); decay: EMA weight of the past for the aux branch's worth."""

    max_tokens: int = 7
    per_source: int = 4
    allocate: bool = True
    explore_every: int = 16
    aux_prior: float = 1.0
    decay: float = 0.8

    def __post_init__(self) -> None:
        if self.max_tokens < 1 or self.per_source < 0 or self.explore_every < 1:
            raise ValueError(f"max_tokens >= 1, per_source >= 0 and explore_every >= 1 required, got {self}")


class SourcePool:
    """A Proposer over `sources`; `calibrator` and `confidence` may be shared by the requests of a class."""

    def __init__(self, sources: Sequence[CandidateSource], cfg: PoolConfig, calibrator: Calibrator,
                 confidence: ModelConfidence | None = None) -> None:
        names = [s.name for s in sources]
        if len(set(names)) != len(names):
            raise ValueError(f"each source may appear once, got {names}")
        self.sources = list(sources)
        self.cfg = cfg
        self.calibrator = calibrator
        self.tracker = calibrator.tracker()
        aux = [s for s in self.sources if isinstance(s, RunsAuxBranch)]
        self.aux_source = aux[0] if aux else None
        self.aux_name = self.aux_source.name if self.aux_source is not None else None  # type: ignore[attr-defined]
        self.top_k = max((s.top_k for s in self.sources if isinstance(s, WantsSuccessors)), default=0)
        # the model's confidence in guessed tokens, from the top-k rows the steps report (top_k > 0 only);
        # `confidence`: a store shared by the requests of a class (the recycled successors' table keeps one)
        use = self.top_k and calibrator.cfg.confidence
        self.confidence = (confidence if confidence is not None else ModelConfidence()) if use else None
        self._stateful = [s for s in self.sources if isinstance(s, WantsStates) and s.states]
        self.states = bool(self._stateful)  # the engine reports final hidden states (engine/sources.WantsStates)
        self.aux_worth = cfg.aux_prior
        self._idle = 0  # steps since the aux branch last ran
        self._firsts: list[tuple[int, float, bool]] = []  # this step's first tokens, uncorrected probabilities, agreed

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        n = min(self.cfg.max_tokens, budget)
        guesses = []
        if n > 0 and self.cfg.per_source > 0:
            for source in self.sources:
                guesses.extend(source.candidates(context, n, self.cfg.per_source))
        calibrator = self.calibrator
        if self.confidence is not None:  # the model's confidence in each guessed token scales its rate
            notes = [(rates, self.confidence.path(context, g.tokens))
                     for g, rates in zip(guesses, calibrator.conditionals_of(guesses))]
            self.tracker.offer(guesses, notes)
            scored = [(calibrator.path_probabilities(g, buckets, rates), g) for (rates, buckets), g in zip(notes, guesses)]
        else:
            self.tracker.offer(guesses)
            scored = [(calibrator.path_probabilities(g), g) for g in guesses]
        scored.sort(key=lambda item: sum(item[0]), reverse=True)  # stable: sources keep their own order on ties
        tree = CandidateTree()
        for probs, guess in scored:
            tree.add(guess.tokens, guess.source, probs)
        self._firsts = []
        if self.calibrator.cfg.siblings:
            agreed = _agreed(guesses) if self.calibrator.cfg.agreement else set()
            self._firsts = self._correct_first_tokens(tree, agreed)
            tree.cap_siblings()
        if self.aux_source is None:
            return Draft(tree=tree, calibrated=self.cfg.allocate)
        drift = min(1.0, self._idle / self.cfg.explore_every)
        worth = self.aux_worth + (self.cfg.aux_prior - self.aux_worth) * drift
        return Draft(tree=tree, aux=self.aux_source.branch(), aux_value=max(worth, 0.0), calibrated=self.cfg.allocate)

    def _correct_first_tokens(self, tree: CandidateTree, agreed: set[int]) -> list[tuple[int, float, bool]]:
        """Scale each first token's subtree by the calibrator's factor for its rank among the distinct
        first tokens and for whether several sources proposed it (`agreed`: those tokens;
        engine/calibration.sibling_factor). Returns the first tokens best first with the probabilities
        they had before and their agreement, to be scored once the step says which one was right."""
        firsts = sorted((i for i in range(len(tree)) if tree.parents[i] < 0), key=lambda i: -tree.probs[i])
        before = [(tree.tokens[i], tree.probs[i], tree.tokens[i] in agreed) for i in firsts]
        factor = [1.0] * len(tree)
        for rank, i in enumerate(firsts):
            factor[i] = self.calibrator.sibling_factor(rank, tree.tokens[i] in agreed)
        for i in range(len(tree)):  # parents come first: a node takes its first token's factor
            if tree.parents[i] >= 0:
                factor[i] = factor[tree.parents[i]]
            tree.probs[i] = min(1.0, tree.probs[i] * factor[i])
        return before

    def update(self, context: Sequence[int], outcome: StepOutcome) -> None:
        self.tracker.record(outcome.accepted)
        if self._firsts and outcome.accepted:  # which first token (if any) the model produced
            hit = next((r for r, (t, _, _) in enumerate(self._firsts) if t == outcome.accepted[0]), None)
            self.calibrator.observe_siblings([p for _, p, _ in self._firsts], hit, [a for _, _, a in self._firsts])
        if self.aux_source is not None:
            if outcome.aux_out:
                earned = sum(1 for s in outcome.accepted_sources if s == self.aux_name)
                self.aux_worth = self.cfg.decay * self.aux_worth + (1 - self.cfg.decay) * earned
                self._idle = 0
            else:
                self._idle += 1
        obs = Observation(context, outcome.accepted, outcome.aux_out, outcome.successors, outcome.predecessors,
                          outcome.successor_logits)
        for source in self.sources:
            source.observe(obs)
        if self.confidence is not None:
            self.confidence.observe(obs)
        if outcome.states is not None:  # the root's and the matched nodes' states: the root sat at len - accepted - 1
            self.observe_states(len(context) - len(outcome.accepted) - 1, outcome.states)

    def observe_states(self, start: int, states: torch.Tensor) -> None:
        """Final hidden states at text positions start.. (the prompt's after the prefill; a step's in `update`)."""
        for source in self._stateful:
            source.observe_states(start, states)


def _agreed(guesses: Sequence[Candidate]) -> set[int]:
    """The first tokens that more than one source proposed."""
    proposers: dict[int, set[str]] = {}
    for guess in guesses:
        proposers.setdefault(guess.tokens[0], set()).add(guess.source)
    return {token for token, names in proposers.items() if len(names) > 1}
