"""Lookahead decoding's candidate source: a 2-D Jacobi window that mints n-grams, plus n-gram pools.

The window has W columns and up to N-1 levels. Token (level l, column i) is a guess for position
p + 1 + l + i (p = the root's position). In a step, token (l, i) sees the prefix, the root, the level-0
tokens of columns 0..i and the tokens of column i at levels 1..l: a contiguous sequence of positions
p+1 .. p+1+l+i, i.e. one Jacobi trajectory. The newest level's outputs are the next Jacobi iterate:

    step k:    level0  a0 a1 a2 a3        n-gram of column i: (level0[i], ..., level{N-2}[i], out[i])
               level1  b0 b1 b2 b3        goes to the pool under key level0[i]; then level 0 is
               ...                        dropped and `out` becomes the newest level.
               out     c0 c1 c2 c3

The verification branch takes up to G continuations from a hybrid pool: Jacobi n-grams keyed by the
root token, context matches (the longest suffix match in prompt + generated text) and, with a
cross-request n-gram cache, its matches. They compete for the G slots by a cheap score (recency
within a source times the source's running acceptance; see ranking.SourceScores).
"""

from __future__ import annotations

import random
from typing import Sequence

import torch

from lookahead.candidates.ngram_cache import NGramCache
from lookahead.candidates.ngrams import ContextIndex, NGramPool
from lookahead.candidates.ranking import SourceScores
from lookahead.config import LookaheadConfig
from lookahead.engine.draft import AuxBranch, CandidateTree, Draft, StepOutcome


class JacobiWindow:
    """The lookahead branch: W columns x up to N-1 levels of guessed tokens."""

    def __init__(self, window: int, ngram: int, seed_tokens: Sequence[int], rng_seed: int = 0) -> None:
        self.w, self.n = window, ngram
        rng = random.Random(rng_seed)
        pool = list(seed_tokens) or [0]
        self.levels: list[list[int]] = [[rng.choice(pool) for _ in range(window)]]
        self._shapes: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

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
        offsets, visible, out_rows = self._shape(len(self.levels))
        tokens = torch.tensor([t for level in self.levels for t in level])
        return AuxBranch(tokens=tokens, offsets=offsets, visible=visible, out_rows=out_rows)

    def advance(self, out: list[int]) -> list[tuple[int, tuple[int, ...]]]:
        """Append the newest level; when the window is full, return its W n-grams and drop level 0."""
        self.levels.append(list(out))
        if len(self.levels) < self.n:
            return []
        grams = [(self.levels[0][i], tuple(self.levels[l][i] for l in range(1, self.n))) for i in range(self.w)]
        del self.levels[0]
        return grams


class LookaheadProposer:
    """Candidates for lookahead decoding: Jacobi n-grams and (optionally) prompt/context n-grams and
    cross-request n-grams (`cache`; used only with context_ngrams, the Jacobi-only mode ignores it)."""

    def __init__(self, cfg: LookaheadConfig, prompt: Sequence[int], cache: NGramCache | None = None) -> None:
        self.cfg = cfg
        self.length = cfg.ngram - 1  # tokens per Jacobi candidate after the root
        self.context_length = cfg.context_tokens or self.length  # context and cache candidates
        self.pool = NGramPool(cfg.max_pool_per_key)
        self.window = JacobiWindow(cfg.window, cfg.ngram, prompt, rng_seed=len(prompt))
        self.context = ContextIndex() if cfg.context_ngrams else None
        if self.context is not None:
            self.context.extend(prompt)
        self.cache = cache if cfg.context_ngrams else None
        self.scores = SourceScores()

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        tree = CandidateTree()
        length, copied = min(self.length, budget), min(self.context_length, budget)
        if length > 0 and self.cfg.guesses > 0:
            g = self.cfg.guesses
            lists: dict[str, list[tuple[int, ...]]] = {}
            if self.context is not None:
                lists["context"] = self.context.lookup(context, copied, g)
            if self.cache is not None:
                lists["cache"] = self.cache.lookup(context, copied, g)
            lists["jacobi"] = [cont[:length] for cont in self.pool.get(context[-1], g)]
            for source, cont in self.scores.select(lists, g):
                tree.add(cont, source)
        return Draft(tree=tree, aux=self.window.branch())

    def update(self, context: Sequence[int], outcome: StepOutcome) -> None:
        if outcome.aux_out:  # empty when the window was skipped (near the end of the context)
            for first, cont in self.window.advance(outcome.aux_out):
                self.pool.add(first, cont)
        if self.context is not None:
            self.context.extend(outcome.accepted)
        self.scores.observe(outcome)
