"""Speculate only when it pays: a per-step gate that fits the work to the device.

A speculative step costs r times a one-token step (r = t(q)/t(1), measured online from the step
timings: ~1.7 on a 2-core CPU, ~1.0 on a GPU) and yields 1 + a tokens, a = accepted candidate tokens.
It beats a plain one-token step when E[a] > r - 1. E[a] is estimated per candidate source from
counterfactual scoring: every candidate proposed, verified or not, is later compared with the tokens
actually generated at its positions, so a source's estimate stays current even while it is gated off.

The gate never changes which tokens are produced (verification decides that); it only decides how
much work a step does.
"""

from __future__ import annotations

from dataclasses import dataclass

from lookahead.engine.draft import CandidateTree, Draft

_PRIOR_ACCEPT = 1.0  # optimistic start: every source gets tried
_PRIOR_RATIO = 1.4  # until both step kinds have been timed
_WINDOW_SHARE = 0.5  # a lookahead window is worth half of what its Jacobi n-grams have been earning


@dataclass(frozen=True)
class GateConfig:
    """adaptive: gate speculative steps on expected gain (False: always run the draft as proposed).
    step_cost: fixed r (cost of a speculative step in one-token steps); None measures it online."""

    adaptive: bool = True
    step_cost: float | None = None
    decay: float = 0.85  # EMA weight of the past for acceptance and timing estimates


class SpeculationGate:
    def __init__(self, cfg: GateConfig = GateConfig()) -> None:
        self.cfg = cfg
        self.accept: dict[str, float] = {}  # source -> EMA of tokens a candidate would have got accepted
        self.t_plain: float | None = None  # EMA seconds of a one-token step
        self.t_spec: float | None = None  # EMA seconds of a speculative step
        self.history: list[int] = []  # tokens generated since the gate started
        self.pending: list[tuple[int, tuple[int, ...], str]] = []  # (start in history, candidate, source)

    # -- decision -------------------------------------------------------------------------------
    def ratio(self) -> float:
        if self.cfg.step_cost is not None:
            return self.cfg.step_cost
        if self.t_plain and self.t_spec:
            return max(self.t_spec / self.t_plain, 1.0)
        return _PRIOR_RATIO

    def admit(self, draft: Draft) -> Draft:
        """The draft itself, or an empty one (a plain one-token step) when it is not worth its cost."""
        leaves = _leaf_paths(draft.tree)
        start = len(self.history)
        self.pending.extend((start, tokens, source) for tokens, source in leaves)
        if not self.cfg.adaptive or (not leaves and draft.aux is None):
            return draft
        expected = max((self.accept.get(source, _PRIOR_ACCEPT) for _, source in leaves), default=0.0)
        if draft.aux is not None:  # the window also mints n-grams for later steps
            expected += _WINDOW_SHARE * self.accept.get("jacobi", _PRIOR_ACCEPT)
        return draft if expected > self.ratio() - 1.0 else Draft(tree=CandidateTree())

    # -- learning -------------------------------------------------------------------------------
    def observe(self, accepted: list[int], query_tokens: int, seconds: float) -> None:
        d = self.cfg.decay
        if query_tokens == 1:
            self.t_plain = seconds if self.t_plain is None else d * self.t_plain + (1 - d) * seconds
        else:
            self.t_spec = seconds if self.t_spec is None else d * self.t_spec + (1 - d) * seconds
        self.history.extend(accepted)
        still: list[tuple[int, tuple[int, ...], str]] = []
        n = len(self.history)
        for start, tokens, source in self.pending:
            if start + len(tokens) > n:
                still.append((start, tokens, source))
                continue
            got = 0
            for i, t in enumerate(tokens):
                if self.history[start + i] != t:
                    break
                got += 1
            prev = self.accept.get(source, _PRIOR_ACCEPT)
            self.accept[source] = d * prev + (1 - d) * got
        self.pending = still


def _leaf_paths(tree: CandidateTree) -> list[tuple[tuple[int, ...], str]]:
    """Every root-to-leaf path of the trie with the source of its leaf."""
    if not len(tree):
        return []
    is_parent = set(tree.parents)
    out = []
    for leaf in range(len(tree)):
        if leaf in is_parent:
            continue
        path: list[int] = []
        node = leaf
        while node >= 0:
            path.append(tree.tokens[node])
            node = tree.parents[node]
        out.append((tuple(reversed(path)), tree.sources[leaf]))
    return out
