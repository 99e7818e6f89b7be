"""Lookahead decoding's candidate source: a 2-D Jacobi window that mints n-grams, plus n-gram pools.

The window has W columns and up to N-1 levels. Token (level l, column i) is a guess for position
p + 1 + l + i (p = the root's position). In a step, token (l, i) sees the prefix, the root, the level-0
tokens of columns 0..i and the tokens of column i at levels 1..l: a contiguous sequence of positions
p+1 .. p+1+l+i, i.e. one Jacobi trajectory. The newest level's outputs are the next Jacobi iterate:

    step k:    level0  a0 a1 a2 a3        n-gram of column i: (level0[i], ..., level{N-2}[i], out[i])
               level1  b0 b1 b2 b3        goes to the pool under key level0[i]; then level 0 is
               ...                        dropped and `out` becomes the newest level.
               out     c0 c1 c2 c3

The verification branch takes up to G pooled n-grams keyed by the root token. In the "lookahead"
strategy they compete with the other free sources (candidates/registry.py) for the step's rows, each
guess calibrated by what verification confirmed (engine/calibration.py), and the window itself runs
only while what it mints is worth its rows (engine/allocator.py, candidates/pool.py).
"""

from __future__ import annotations

import random
from typing import Sequence

import torch

from lookahead.candidates.ngrams import NGramPool
from lookahead.engine.draft import AuxBranch
from lookahead.engine.sources import Candidate, Observation


class JacobiWindow:
    """The lookahead branch: W columns x up to N-1 levels of guessed tokens."""

    def __init__(self, window: int, ngram: int, seed_tokens: Sequence[int], rng_seed: int = 0) -> None:
        self.w, self.n = window, ngram
        rng = random.Random(rng_seed)
        pool = list(seed_tokens) or [0]
        self.levels: list[list[int]] = [[rng.choice(pool) for _ in range(window)]]
        self._shapes: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._branch: AuxBranch | None = None  # the rows of the current levels (a step that runs none keeps them)

    def _shape(self, n_levels: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(offsets[A], visible[A, A], out_rows[W]) for a window of n_levels levels; cached."""
        if n_levels not in self._shapes:
            level = torch.arange(n_levels).repeat_interleave(self.w)  # [A] row-major (level, column)
            col = torch.arange(self.w).repeat(n_levels)
            offsets = 1 + level + col
            same_col = col[:, None] == col[None, :]
            visible = ((level[None, :] == 0) & (col[None, :] <= col[:, None])) | (
                same_col & (level[None, :] <= level[:, None])
            )
            out_rows = torch.arange((n_levels - 1) * self.w, n_levels * self.w)
            self._shapes[n_levels] = (offsets, visible, out_rows)
        return self._shapes[n_levels]

    def branch(self) -> AuxBranch:
        """The window's rows for the next step: offered every step, run in few (the allocator runs it only
        while what it mints pays for its rows), so built again only after the levels change."""
        if self._branch is None:
            offsets, visible, out_rows = self._shape(len(self.levels))
            tokens = torch.tensor([t for level in self.levels for t in level])
            self._branch = AuxBranch(tokens=tokens, offsets=offsets, visible=visible, out_rows=out_rows)
        return self._branch

    def advance(self, out: list[int]) -> list[tuple[int, tuple[int, ...]]]:
        """Append the newest level; when the window is full, return its W n-grams and drop level 0."""
        self._branch = None
        self.levels.append(list(out))
        if len(self.levels) < self.n:
            return []
        grams = [(self.levels[0][i], tuple(self.levels[l][i] for l in range(1, self.n))) for i in range(self.w)]
        del self.levels[0]
        return grams


class JacobiSource:
    """Lookahead decoding's own source ("jacobi"): the window above, and the pool of the n-grams it
    mints, keyed by their first token. Candidates are the pooled continuations of the root, most recent
    first (feature: min(rank, 3)); `branch` is the window's rows for the next step."""

    name = "jacobi"

    def __init__(self, window: int, ngram: int, prompt: Sequence[int], max_pool_per_key: int = 16) -> None:
        self.length = ngram - 1  # tokens per pooled continuation
        self.pool = NGramPool(max_pool_per_key)
        self.window = JacobiWindow(window, ngram, prompt, rng_seed=len(prompt))

    def candidates(self, context: Sequence[int], max_tokens: int, limit: int) -> list[Candidate]:
        n = min(max_tokens, self.length)
        if n <= 0 or limit <= 0:
            return []
        conts = self.pool.get(context[-1], limit)
        return [Candidate(cont[:n], self.name, min(rank, 3)) for rank, cont in enumerate(conts)]

    def branch(self) -> AuxBranch:
        return self.window.branch()

    def observe(self, obs: Observation) -> None:
        if obs.aux_out:  # empty when the window did not run this step
            for first, cont in self.window.advance(list(obs.aux_out)):
                self.pool.add(first, cont)
