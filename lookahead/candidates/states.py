"""The model's final hidden states by text position, for sources that compare them (engine/sources.WantsStates).

The engine reports the final hidden state (the LM head's input) of every token it caches: the prompt's at
the prefill, then each step's root and matched nodes. At a step whose root is T[n-1], the newest known
state is T[n-2]'s: the row that chose the root. The store keeps them as unit vectors, so a dot product is
a cosine, and says which of a set of positions holds the state nearest to a given one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


class HiddenStates:
    """Unit-length final hidden states by text position (positions without a report are unknown)."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self._unit = np.zeros((0, 0), dtype=np.float32)  # [capacity, D]
        self._known = np.zeros(0, dtype=bool)  # [capacity]

    def observe(self, start: int, states: torch.Tensor) -> None:
        """`states` [n, D]: the states at positions start .. start + n - 1 (a later report replaces an earlier)."""
        n = int(states.shape[0])
        if start < 0 or n == 0:
            return
        x = states.detach().float().cpu().numpy()
        norms = np.linalg.norm(x, axis=1, keepdims=True)
        x /= np.where(norms > 0, norms, 1.0)
        end, width = start + n, x.shape[1]
        if self._unit.shape[1] != width:  # the first report (or another model's): start over
            self._unit = np.zeros((max(end, 256), width), dtype=np.float32)
            self._known = np.zeros(self._unit.shape[0], dtype=bool)
        elif end > self._unit.shape[0]:
            grown = max(end, 2 * self._unit.shape[0])
            self._unit = np.concatenate([self._unit, np.zeros((grown - self._unit.shape[0], width), np.float32)])
            self._known = np.concatenate([self._known, np.zeros(grown - self._known.shape[0], dtype=bool)])
        self._unit[start:end] = x
        self._known[start:end] = True

    def known(self, position: int) -> bool:
        return 0 <= position < self._known.shape[0] and bool(self._known[position])

    @property
    def count(self) -> int:
        """Positions with a known state."""
        return int(self._known.sum())

    def nearest(self, here: int, positions: Sequence[int]) -> int | None:
        """Of `positions`, the first whose state is nearest (cosine) to position `here`'s; those without a
        known state are passed over. None: `here` or every one of them unknown."""
        if not self.known(here):
            return None
        cands = [p for p in positions if self.known(p)]
        if not cands:
            return None
        sims = self._unit[cands] @ self._unit[here]  # [len(cands)]
        return cands[int(np.argmax(sims))]
