"""A candidate source tried and not taken: "detours", the model's predictions after a guess it rejected,
offered for the token it chose instead (2026-12-07; see docs/measurements.md, "Measured: guesses from
rejected branches, not taken").

A step verifies a tree; the last accepted node `a` may have had children the model rejected: guesses
`c` where the model chose `b`. Each such row's output is the model's next token after `a c`, a
prediction for the position after `b` made with one token wrong (Jacobi decoding's premise: such
predictions are often still right). Deeper rows below `c` along the model's own predictions extend
the guess. No extra rows: they ran in the last step; the guesses are offered in the next step only.

Usage (same arguments as benchmarks/sources_ab.py; this script registers the source as "detour"):
    python docs/results/detour-source/detour_ab.py --workload /tmp/wl \\
        --a suffix,recycle,cache,jacobi,resume --b suffix,recycle,cache,jacobi,resume,detour --per-class 12 --from 30
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from lookahead.candidates import registry
from lookahead.engine.sources import HISTORY, Candidate, Observation

_AGREED = 3  # added to the feature when several rejected children predicted the same first token


class DetourSource:
    """Feature: rank bucket of the rejected child in the model's list at `a` (0: its second choice, 1:
    third to top-k, 2: outside), + 3 when two or more rejected children predicted the same first token."""

    name: str = "detour"
    top_k: int = 1  # the step reports each row's best next token (engine/sources.WantsSuccessors)

    def __init__(self) -> None:
        self._at = -1  # the context length these guesses are for (only the next step may use them)
        self._guesses: list[Candidate] = []

    def observe(self, obs: Observation) -> None:
        self._guesses = []
        context = obs.context
        self._at = len(context)
        if len(context) < 2 or not obs.accepted or len(obs.predecessors) != len(obs.successors):
            return
        chosen, last = context[-1], context[-2]  # the step's own token b, after the last accepted node a
        parent_key = tuple(context[max(len(context) - 1 - HISTORY, 0) : -1])[-HISTORY:]  # before a's children
        rows: dict[tuple[tuple[int, ...], int], tuple[int, ...]] = {}
        for (token, nxt), before in zip(obs.successors, obs.predecessors):
            if nxt:
                rows[(tuple(before), token)] = nxt
        mine = rows.get((tuple(context[max(len(context) - 2 - HISTORY, 0) : -2])[-HISTORY:], last), ())
        chains: list[tuple[int, tuple[int, ...]]] = []
        for (before, token), nxt in rows.items():
            if before != parent_key or token == chosen:
                continue  # not a rejected child of a
            chain = [nxt[0]]
            path = (*parent_key, token)  # follow the tree further down the model's own predictions
            while len(chain) <= len(rows):  # at most one token a row (tokens may repeat in a cycle)
                row = rows.get((path[-HISTORY:], chain[-1]))
                if row is None:
                    break
                path = (*path, chain[-1])
                chain.append(row[0])
            rank = mine.index(token) - 1 if token in mine else None
            chains.append((2 if rank is None else min(rank, 1), tuple(chain)))
        firsts: dict[int, int] = {}
        for _, chain in chains:
            firsts[chain[0]] = firsts.get(chain[0], 0) + 1
        seen: set[tuple[int, ...]] = set()
        for bucket, chain in sorted(chains, key=lambda bc: (-firsts[bc[1][0]], bc[0], -len(bc[1]))):
            if chain not in seen:
                seen.add(chain)
                self._guesses.append(Candidate(chain, self.name, bucket + (_AGREED if firsts[chain[0]] > 1 else 0)))

    def candidates(self, context: Sequence[int], max_tokens: int, limit: int) -> list[Candidate]:
        if len(context) != self._at or max_tokens <= 0 or limit <= 0:
            return []
        out: list[Candidate] = []
        seen: set[tuple[int, ...]] = set()
        for guess in self._guesses:
            tokens = guess.tokens[:max_tokens]
            if tokens not in seen:
                seen.add(tokens)
                out.append(Candidate(tokens, guess.source, guess.feature))
            if len(out) >= limit:
                break
        return out


if __name__ == "__main__":
    registry.SOURCES["detour"] = lambda x: DetourSource()
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
    from sources_ab import main  # noqa: E402

    raise SystemExit(main())
