"""The model's own confidence in a guessed token, read off predictions it has already made.

Every row a step computes comes back with the model's k likeliest next tokens and their logits
(engine/sources.Observation). The newest such row for a token, keyed also by the token before it, says
how sure the model was of what follows that token: a guessed token the model gave 0.95 there is far
likelier to be accepted after the same token now than one it gave 0.02, or one not among its k best.
`ModelConfidence` keeps those rows and buckets a guess's tokens by that probability (one store per
recycled-successor table, so the requests that share the table share it; candidates/registry.py); the calibrator
corrects its per-source rates by bucket (engine/calibration.py, `CalibrationConfig.confidence`), so
the allocator verifies deep nodes the model believes in and skips the ones it does not, whatever
source proposed them.

Measured before building it (SmolLM2-135M bf16, 10 requests a class, greedy, the calibrator's own
conditional rates against what verification later confirmed, nodes whose parent was right): recycled
nodes at depth 2+ that the model gave under 0.1 were accepted 4% of the time where the calibrator said
23%, those it gave 0.9+ 66% where it said 44%; a suffix match's first token the model had not ranked
among its 8 best 9% (said 15%), one it gave 0.9+ 66% (said 42%).

Probabilities are a softmax over the row's k logits only (the tail's mass is unknown): an upper bound
of the model's probability, and monotone in it among the row's tokens. Under sampling the logits are
the raw ones (before temperature); the buckets are learned per calibrator, so only the order matters.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence

from lookahead.engine.sources import Observation

UNKNOWN = 0  # no row for the parent token yet
ABSENT = 1  # a row, but the token is not among its k best
EDGES = (0.1, 0.3, 0.6, 0.9)  # probability buckets 2 .. 6: [0, .1), [.1, .3), [.3, .6), [.6, .9), [.9, 1]
BUCKETS = 2 + len(EDGES) + 1


def bucket_of(p: float) -> int:
    """The bucket of a probability among a row's tokens: 2 + the number of EDGES at or below it."""
    return 2 + bisect_right(EDGES, p)


class ModelConfidence:
    """token (and previous token, token) -> {next token: bucket} from the newest row the model computed
    for it; at most `max_rows` keys (the oldest written dropped first)."""

    def __init__(self, max_rows: int = 16384) -> None:
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.max_rows = max_rows
        self.rows: dict[tuple[int, ...], dict[int, int]] = {}

    def observe(self, obs: Observation) -> None:
        """The rows of one step: each row's input token, its top-k tokens and their logits, and the
        tokens before it on its own path (Observation.predecessors; none for aux rows)."""
        if len(obs.logits) != len(obs.successors):
            return  # the step reported no logits
        before = obs.predecessors if len(obs.predecessors) == len(obs.successors) else [()] * len(obs.successors)
        rows = self.rows
        for (token, nxt), values, prev in zip(obs.successors, obs.logits, before):
            if not values:
                continue
            top = max(values)
            weights = [math.exp(v - top) for v in values]
            total = sum(weights)
            row = {t: bucket_of(w / total) for t, w in zip(nxt, weights)}
            for key in ((token,), (prev[-1], token)) if prev else ((token,),):
                rows.pop(key, None)  # re-inserted last: the newest written
                rows[key] = row
        while len(rows) > self.max_rows:  # (a store shared by requests in several threads: tolerate a race)
            try:
                rows.pop(next(iter(rows)), None)
            except (RuntimeError, StopIteration):
                break

    def path(self, context: Sequence[int], tokens: Sequence[int]) -> list[int]:
        """The bucket of each guessed token after `context` (whose last token is the root): token i is
        looked up in the row of the token before it, keyed by the one before that where the model has
        computed one after the same pair, else by the token alone."""
        out: list[int] = []
        rows = self.rows
        prev = context[-2] if len(context) > 1 else None
        parent = context[-1] if context else None
        for token in tokens:
            row = rows.get((prev, parent)) if prev is not None else None
            if row is None:
                row = rows.get((parent,))
            out.append(UNKNOWN if row is None else row.get(token, ABSENT))
            prev, parent = parent, token
        return out
