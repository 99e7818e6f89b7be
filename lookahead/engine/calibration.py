"""Calibrated acceptance: how likely a guess is to be accepted, learned online from what the model did.

For a candidate of source s and feature f (the source's own confidence bucket), the calibrator keeps,
per depth d, decayed counts of

    reached(s, f, d): the guess's tokens 1..d-1 were all right (so token d was put to the test)
    hit(s, f, d):     token d was right too

and estimates P(token d right | tokens before it right) by a smoothed ratio

    (hit + k * m) / (reached + k),    k = a + b,

shrunk towards m with the weight of k pseudo-counts. m is what the source's *other* features say at
that depth, itself smoothed towards the fixed prior a / (a + b):

    m = (hit(s, other f, d) + a) / (reached(s, other f, d) + a + b)

So a feature seen rarely (a rank-5 recycled successor, a long suffix match) starts from its source's
measured rate at that depth rather than from a fixed 1/3: on text where the source is almost never
right its unseen features are not worth a wide step either, and where it is usually right they are.
With `backoff=False` (or a source with one feature) m is the fixed prior: plain Laplace smoothing.
The probability that a node's whole path is accepted is the product of those ratios down to its depth
(`path_probabilities`).

Depth backoff: a guess that has been right for d-1 tokens is aligned with the text (a copy whose source
passage is the one being written, a recycled run the model keeps repeating), so its next token is at
least as likely to be right as the one before it was. With `depth_backoff` the fixed prior at depth d
is raised to the same feature's estimate at depth d-1 where that is higher: a deep, rarely reached
depth starts from the rate above it instead of from 1/3. Measured on the prompt benchmark's six prompts
(SmolLM2-135M, bf16, one calibrator across them as the bench keeps it), the flat prior left deep
guesses priced far below what they did: given the tokens before them right, suffix-match tokens at
depths 5-8 were right 89-100% of the time while the calibrator's ratio said 70-75%, and the allocator
cut those chains short (summed over the steps, 103 right suffix-match nodes were left unverified).

Every candidate offered is scored, whether or not the allocator let it be verified: once the tokens at
its positions have been generated, it is compared with them (counterfactual scoring). So a source that
is not verified for a while still has a current estimate, and the estimate never depends on what the
allocator chose. Decay (per scored guess) lets the estimate follow a request whose text changes.

Sharing (`shared_calibrator`): a fresh calibrator starts every depth at the prior, 1/3, so a chain's
path probability falls as 3^-d and a new request verifies short chains until its own text has taught
it otherwise, which for a 128-token answer is most of the answer. Requests on one model therefore
share one calibrator per strategy and decoding mode in the process (the server: one per request
class), as the cost curve is shared. Measured by replaying the guesses of 30 held-out workload
requests (SmolLM2-135M, bf16, 128 tokens): shared, 1.84 tokens per unit of step cost against 1.71
with a calibrator per request (+7.5%), with 4.8 query rows a step against 3.6. Outputs never depend
on it: it only sizes steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lookahead.engine.shared import shared
from lookahead.engine.sources import Candidate

Key = tuple[str, int, int]  # (source, feature, depth)
ConfidenceKey = tuple[str, int, int]  # (source, 1 or 2 for depths 2+, the model's confidence bucket)
Confidence = tuple[Sequence[float], Sequence[int]]  # a guess's conditionals before the correction, its buckets
SIBLING_RANKS = 4  # first-token ranks corrected apart: 0, 1, 2 and 3+ (and, with `agreement`, again for
# first tokens that more than one source proposed: keys SIBLING_RANKS .. 2 * SIBLING_RANKS - 1)


@dataclass(frozen=True)
class CalibrationConfig:
    """prior_hit / prior_miss: pseudo-counts (a, b): the estimate before any evidence is a / (a + b);
    decay: weight kept by old counts each time a key gets new evidence; max_pending: guesses awaiting
    their tokens (oldest dropped beyond it); backoff: shrink each feature towards its source's other
    features at the same depth instead of towards a / (a + b); depth_backoff: raise that prior at depth
    d > 1 to the estimate at depth d - 1 where it is higher; siblings: let a candidate pool scale the
    tree's first tokens by `sibling_factor` of their rank (candidates/pool.py); agreement: learn that
    factor apart for first tokens that several sources proposed (off by default: it did not pay, docs/measurements.md,
    "Measured: depth backoff in the calibrator"); confidence: scale each guessed token's rate by a factor
    learned for the model's own confidence in it (`confidence_factor`, candidates/confidence.py);
    confidence_decay: the weight those factors' old counts keep per new token scored (slower than `decay`:
    a factor corrects a rate that itself follows the text, and its buckets are many; 0.98 there gave
    +2.3% tokens per unit of step cost, 0.995 +2.9%, docs/measurements.md)."""

    prior_hit: float = 1.0
    prior_miss: float = 2.0
    decay: float = 0.98
    max_pending: int = 4096
    backoff: bool = True
    depth_backoff: bool = True
    siblings: bool = True
    agreement: bool = False  # A/B on held-out requests: paired speed 1.004 (0.97-1.02 per class); off
    confidence: bool = True
    confidence_decay: float = 0.995

    def __post_init__(self) -> None:
        if self.prior_hit <= 0 or self.prior_miss <= 0:
            raise ValueError(f"prior counts must be > 0, got {self.prior_hit}, {self.prior_miss}")
        for name in ("decay", "confidence_decay"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"{name} must be in (0, 1], got {value}")
        for name in ("backoff", "depth_backoff", "siblings", "agreement", "confidence"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")


class Calibrator:
    """Online per-(source, feature, depth) acceptance estimates. One may be shared by the requests of a
    class (the server keeps one per class); each request scores its guesses through its own `tracker`."""

    def __init__(self, cfg: CalibrationConfig = CalibrationConfig()) -> None:
        self.cfg = cfg
        self.hits: dict[Key, float] = {}
        self.reached: dict[Key, float] = {}
        # (source, depth) -> sums of the decayed counts over its features, for the backoff
        self._hits_sd: dict[tuple[str, int], float] = {}
        self._reached_sd: dict[tuple[str, int], float] = {}
        # first-token rank -> decayed sums of predicted probabilities and of hits (sibling_factor)
        self._sib_pred: dict[int, float] = {}
        self._sib_hits: dict[int, float] = {}
        # (source, depth 1 or 2 for 2+, confidence bucket) -> decayed sums of predicted conditionals and of hits
        self._conf_pred: dict[ConfidenceKey, float] = {}
        self._conf_hits: dict[ConfidenceKey, float] = {}

    # -- estimates ------------------------------------------------------------------------------
    def conditional(self, source: str, feature: int, depth: int) -> float:
        """P(token at `depth` accepted | the tokens before it accepted)."""
        return self._conditionals(source, feature, depth)[-1]

    def _conditionals(self, source: str, feature: int, depth: int) -> list[float]:
        """[depth]: the conditional estimates at depths 1..depth, each depth's prior from the one before."""
        a, b = self.cfg.prior_hit, self.cfg.prior_miss
        k, fixed = a + b, a / (a + b)
        out: list[float] = []
        for d in range(1, depth + 1):
            key = (source, feature, d)
            hit, reached = self.hits.get(key, 0.0), self.reached.get(key, 0.0)
            prior = max(fixed, out[-1]) if out and self.cfg.depth_backoff else fixed
            m = prior
            if self.cfg.backoff:  # the source's other features at this depth
                others_hit = self._hits_sd.get((source, d), 0.0) - hit
                others_reached = self._reached_sd.get((source, d), 0.0) - reached
                if others_reached > 1e-9:
                    m = (max(others_hit, 0.0) + k * prior) / (others_reached + k)
            out.append((hit + k * m) / (reached + k))
        return out

    def conditionals(self, cand: Candidate) -> list[float]:
        """[len(cand.tokens)]: P(token d accepted | tokens before it accepted), per d, from the candidate's
        (source, feature) alone."""
        return self._conditionals(cand.source, cand.feature, len(cand.tokens))

    def conditionals_of(self, cands: Sequence[Candidate]) -> list[list[float]]:
        """`conditionals(c)` for each of `cands`, computed once per (source, feature) to the longest
        candidate's depth (a depth's estimate depends only on the depths before it, so a shorter one's
        are a prefix): a step scores ~5 guesses of up to 8 tokens, several with the same key."""
        longest: dict[tuple[str, int], int] = {}
        for c in cands:
            key = (c.source, c.feature)
            longest[key] = max(longest.get(key, 0), len(c.tokens))
        rates = {key: self._conditionals(*key, depth) for key, depth in longest.items()}
        return [rates[(c.source, c.feature)][: len(c.tokens)] for c in cands]

    def path_probabilities(self, cand: Candidate, buckets: Sequence[int] | None = None,
                           conditionals: Sequence[float] | None = None) -> list[float]:
        """[len(cand.tokens)]: the probability that the candidate's tokens 1..d are all accepted, per d.
        `buckets`: the model's confidence in each token (candidates/confidence.py), whose learned factors
        scale the conditionals (with CalibrationConfig.confidence); `conditionals`: `conditionals(cand)`,
        where the caller has them."""
        rates = self.conditionals(cand) if conditionals is None else conditionals
        if buckets is not None and self.cfg.confidence:
            factor = self.confidence_factor
            rates = [min(1.0, rate * factor(cand.source, depth, bucket))
                     for depth, (rate, bucket) in enumerate(zip(rates, buckets, strict=True), start=1)]
        out: list[float] = []
        p = 1.0
        for rate in rates:
            p *= rate
            out.append(p)
        return out

    # -- the model's confidence in a token ------------------------------------------------------
    def confidence_factor(self, source: str, depth: int, bucket: int) -> float:
        """Correction of `source`'s conditional rate at `depth` for a token in confidence `bucket`:
        (hits + k) / (predicted + k) over the tokens of that kind scored so far, shrunk towards 1 by
        k = a + b pseudo-counts (as `sibling_factor`)."""
        k = self.cfg.prior_hit + self.cfg.prior_miss
        key = (source, min(depth, 2), bucket)
        return (self._conf_hits.get(key, 0.0) + k) / (self._conf_pred.get(key, 0.0) + k)

    def observe_confidence(self, source: str, depth: int, bucket: int, predicted: float, hit: bool) -> None:
        """A token of `source` at `depth` in confidence `bucket`, whose conditional rate was `predicted`
        (before the correction), was put to the test; `hit`: it was right."""
        key, d = (source, min(depth, 2), bucket), self.cfg.confidence_decay
        self._conf_pred[key] = d * self._conf_pred.get(key, 0.0) + predicted
        self._conf_hits[key] = d * self._conf_hits.get(key, 0.0) + (1.0 if hit else 0.0)

    def observe(self, cand: Candidate, depth: int, hit: bool) -> None:
        """Token `depth` of `cand` was put to the test (the ones before it were right); `hit`: it was right too."""
        key, d = (cand.source, cand.feature, depth), self.cfg.decay
        old_reached, old_hits = self.reached.get(key, 0.0), self.hits.get(key, 0.0)
        self.reached[key] = d * old_reached + 1.0
        self.hits[key] = d * old_hits + (1.0 if hit else 0.0)
        sd = (cand.source, depth)  # keep the per-(source, depth) sums equal to the sums of their keys
        self._reached_sd[sd] = self._reached_sd.get(sd, 0.0) + self.reached[key] - old_reached
        self._hits_sd[sd] = self._hits_sd.get(sd, 0.0) + self.hits[key] - old_hits

    # -- the merged tree's first tokens ---------------------------------------------------------
    def sibling_factor(self, rank: int, agreed: bool = False) -> float:
        """Correction for the first token ranked `rank` (0: the most probable) among the tree's distinct
        first tokens. Per-source estimates are marginal rates; where sources disagree on the next token
        at most one of them is right, so the runners-up are worth less than their sources' rates say;
        and where two sources arrived at the same token independently it is worth more than either
        says (`agreed`; learned apart with `agreement`). (hit + k) / (predicted + k): observed over
        predicted, shrunk towards 1 by k = a + b."""
        k = self.cfg.prior_hit + self.cfg.prior_miss
        r = self._sibling_key(rank, agreed)
        return (self._sib_hits.get(r, 0.0) + k) / (self._sib_pred.get(r, 0.0) + k)

    def _sibling_key(self, rank: int, agreed: bool) -> int:
        return min(rank, SIBLING_RANKS - 1) + (SIBLING_RANKS if agreed and self.cfg.agreement else 0)

    def observe_siblings(self, predicted: Sequence[float], hit_rank: int | None,
                         agreed: Sequence[bool] = ()) -> None:
        """One step's first tokens, best first, with the probabilities they were given before the
        correction; `hit_rank`: which of them the model produced (None: none); `agreed[i]`: the i-th was
        proposed by more than one source (default: none was)."""
        d = self.cfg.decay
        for rank, p in enumerate(predicted):
            r = self._sibling_key(rank, rank < len(agreed) and agreed[rank])
            self._sib_pred[r] = d * self._sib_pred.get(r, 0.0) + p
            self._sib_hits[r] = d * self._sib_hits.get(r, 0.0) + (1.0 if rank == hit_rank else 0.0)

    # -- files (lookahead/learned.py) -----------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The decayed counts, as JSON-ready lists (the configuration is not kept: a loaded calibrator
        takes the one it is given). Reads copies, like `report`."""
        reached, hits, pred, sib_hits = dict(self.reached), dict(self.hits), dict(self._sib_pred), dict(self._sib_hits)
        conf_pred, conf_hits = dict(self._conf_pred), dict(self._conf_hits)
        return {"keys": [[s, f, d, min(hits.get((s, f, d), 0.0), n), n] for (s, f, d), n in reached.items()],
                "siblings": [[r, pred.get(r, 0.0), sib_hits.get(r, 0.0)] for r in sorted(set(pred) | set(sib_hits))],
                "confidence": [[s, d, b, p, conf_hits.get((s, d, b), 0.0)] for (s, d, b), p in sorted(conf_pred.items())]}

    @classmethod
    def from_json(cls, data: Any, cfg: CalibrationConfig = CalibrationConfig()) -> Calibrator:
        """The calibrator `to_json` wrote, under `cfg`. Raises ValueError/TypeError/KeyError on
        anything else."""
        out = cls(cfg)
        for source, feature, depth, hit, reached in data["keys"]:
            if not (isinstance(source, str) and type(feature) is int and type(depth) is int and depth >= 1
                    and _count(hit) and _count(reached) and hit <= reached) or (source, feature, depth) in out.reached:
                raise ValueError(f"bad or repeated calibration entry {[source, feature, depth, hit, reached]}")
            key, sd = (source, feature, depth), (source, depth)
            out.hits[key], out.reached[key] = float(hit), float(reached)
            out._hits_sd[sd] = out._hits_sd.get(sd, 0.0) + float(hit)  # the backoff's sums over features
            out._reached_sd[sd] = out._reached_sd.get(sd, 0.0) + float(reached)
        for rank, predicted, hits in data["siblings"]:
            if not (type(rank) is int and 0 <= rank < 2 * SIBLING_RANKS and _count(predicted) and _count(hits)):
                raise ValueError(f"bad sibling entry {[rank, predicted, hits]}")
            out._sib_pred[rank], out._sib_hits[rank] = float(predicted), float(hits)
        for source, depth, bucket, predicted, hits in data.get("confidence", []):  # absent from older files
            if not (isinstance(source, str) and type(depth) is int and depth in (1, 2) and type(bucket) is int
                    and 0 <= bucket < 64 and _count(predicted) and _count(hits)) or (source, depth, bucket) in out._conf_pred:
                raise ValueError(f"bad or repeated confidence entry {[source, depth, bucket, predicted, hits]}")
            out._conf_pred[(source, depth, bucket)], out._conf_hits[(source, depth, bucket)] = float(predicted), float(hits)
        return out

    @property
    def empty(self) -> bool:
        """No guess has been scored yet."""
        return not self.reached and not self._sib_pred and not self._conf_pred

    def tracker(self) -> GuessTracker:
        """A per-request scorer that feeds this calibrator."""
        return GuessTracker(self)

    def report(self) -> dict[str, dict[str, float]]:
        """{"source/feature/depth": {"reached": n, "rate": smoothed P}} for every key with evidence.
        Safe to call from another thread while a request updates the counts (it reads copies)."""
        reached = dict(self.reached)  # one C-level copy: atomic under the GIL
        return {f"{s}/{f}/{d}": {"reached": round(n, 2), "rate": round(self.conditional(s, f, d), 4)}
                for (s, f, d), n in sorted(reached.items())}


class GuessTracker:
    """One request's guesses awaiting their tokens; each is scored once the generated text settles it."""

    def __init__(self, calibrator: Calibrator) -> None:
        self.calibrator = calibrator
        # (index in the generated text of its first token, guess, its conditionals and confidence buckets or None)
        self._pending: list[tuple[int, Candidate, Confidence | None]] = []
        self._generated: list[int] = []

    def offer(self, candidates: Sequence[Candidate], confidence: Sequence[Confidence] | None = None) -> None:
        """Guesses made for the next tokens (before they are generated). `confidence`: per guess, its
        conditional rates before the correction and the model's confidence bucket of each of its tokens
        (Calibrator.path_probabilities), from which the confidence factors learn."""
        start = len(self._generated)
        notes = confidence if confidence is not None else [None] * len(candidates)
        self._pending.extend((start, c, n) for c, n in zip(candidates, notes))
        limit = self.calibrator.cfg.max_pending
        if len(self._pending) > limit:
            del self._pending[: len(self._pending) - limit]

    def record(self, accepted: Sequence[int]) -> None:
        """The tokens generated next (a step's accepted run): score every guess they settle."""
        gen = self._generated
        gen.extend(int(t) for t in accepted)
        still: list[tuple[int, Candidate, Confidence | None]] = []
        calibrator = self.calibrator
        for start, cand, note in self._pending:
            # Compare the guess with the text generated at its positions so far; a miss settles it.
            depth, settled = 0, False
            for i, token in enumerate(cand.tokens):
                if start + i >= len(gen):
                    break
                depth = i + 1
                if gen[start + i] != token:
                    settled = True
                    break
            if not settled and depth < len(cand.tokens):
                still.append((start, cand, note))
                continue
            for i in range(depth):
                hit = gen[start + i] == cand.tokens[i]
                calibrator.observe(cand, i + 1, hit)
                if note is not None:
                    calibrator.observe_confidence(cand.source, i + 1, note[1][i], note[0][i], hit)
        self._pending = still


def _count(x: Any) -> bool:
    """A decayed count as a file may hold one: a finite number >= 0 (not a bool or a string)."""
    return type(x) in (int, float) and math.isfinite(x) and x >= 0


def shared_calibrator(owner: Any, label: str) -> Calibrator:
    """The calibrator that every request on `owner` (a model) labelled `label` shares in this process
    (engine/shared.py), created on first use and dropped with the model."""
    return shared(owner, "calibrator", label, Calibrator)
