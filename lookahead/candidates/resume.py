"""Resume source: after a copy breaks off at one token, guess that it picks up again.

A model that copies a passage (the function it is editing, a JSON schema, a quoted sentence, a number
carried from line to line) often writes one token the passage does not have (a renamed variable, a
changed digit, an inserted word) and then goes on copying. Either the new token *replaced* the
passage's next token (substitution: the copy resumes one token further on) or it was put *in front* of
it (insertion: the copy resumes at the token it skipped). The suffix source cannot see this: its
longest match now ends at the new token, which the passage does not contain, so it has no match or a
short one elsewhere, and a long match re-forms only several tokens later.

State. The text T (prompt, then every accepted token; its last token is the root), the newest earlier
end of every `anchor`-gram of T, and at most `max_hypotheses` pointers into T. A pointer h says "the
copy's next token is T[h]". Each token x appended at position i updates them:
  * an anchor: when the anchor-gram ending at i also ended earlier (newest: at e), h = e + 1 is a
    pointer with no misses (a copy is under way there);
  * a pointer h with T[h] == x moves to h + 1 and its misses return to 0 (the copy went on);
  * a pointer with T[h] != x and fewer than `max_misses` misses splits into the substitution h + 1 and
    the insertion h, each with one more miss; and if T[h + 1] == x (the passage's token was left out),
    into h + 2 with no misses;
  * pointers with more misses than that are dropped; of the rest the fewest misses, then the longest
    run of matched tokens, then the newest position are kept.
Guesses come only from pointers with misses (a copy that has just broken off); a pointer without any is
the copy the suffix source already continues. The guess of pointer h is T[h : h + max_tokens].

Feature (0..3): 0 a substitution after one miss, 1 the same where the copy had matched at least
`long_run` tokens before it broke off, 2 an insertion after one miss, 3 any pointer after two misses.
Few features, so that a class's calibrator learns each one's rates within a few requests: the first
token is rarely right (7-8% over all guesses, teacher-forced as below), but once it is, the copy has
resumed and the next tokens are right 61%, 80%, 80% of the time; the long-run bucket's first tokens
were right about twice as often as the short one's (25% against 12%).

Measured (SmolLM2-135M-Instruct, bfloat16; docs/measurements.md, "Measured: a copy resumed after one changed token"):
teacher-forced over 100 greedy answers (20 per class), every offered guess verified, tokens per step with
the suffix source alone against suffix plus this one: code 2.37 -> 2.46, function calling 2.00 -> 2.16,
chat 1.54 -> 1.57, summarization 2.27 -> 2.39, math 1.96 -> 2.10 (60 other answers: +3% to +5% a class).
In the engine, where the allocator verifies a guess only where its calibrated odds pay for the rows, far
less of it lands: paired on held-out requests +0.7% and +1.5% over the public classes, +1.8% (geomean)
on parameter-rename edits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lookahead.candidates.growing import GrowingText
from lookahead.engine.sources import Candidate, Observation

SUBSTITUTION, INSERTION, MATCHED = 0, 1, 2  # how a pointer came to be where it is


@dataclass(frozen=True)
class _Pointer:
    misses: int  # misses since the copy last matched a token
    run: int  # tokens this copy has matched (capped at 1 << 16)
    kind: int  # SUBSTITUTION / INSERTION after a miss, MATCHED otherwise


class ResumeSource(GrowingText):
    """Guesses that a copy which broke off at one token goes on after it."""

    name: str = "resume"

    def __init__(self, prompt: Sequence[int], anchor: int = 4, max_misses: int = 2, max_hypotheses: int = 4,
                 long_run: int = 8) -> None:
        if anchor < 1 or max_misses < 1 or max_hypotheses < 1 or long_run < 1:
            raise ValueError(f"anchor, max_misses, max_hypotheses and long_run must be >= 1, "
                             f"got {anchor}, {max_misses}, {max_hypotheses}, {long_run}")
        self.anchor = anchor
        self.max_misses = max_misses
        self.max_hypotheses = max_hypotheses
        self.long_run = long_run
        self._reset()
        self._sync(prompt)

    def _reset(self) -> None:
        self._tokens: list[int] = []
        self._ends: dict[tuple[int, ...], int] = {}  # anchor-gram -> its newest end position
        self._pointers: dict[int, _Pointer] = {}  # position of the copy's next token -> its state

    def _extend(self, x: int) -> None:
        tokens = self._tokens
        i = len(tokens)
        tokens.append(x)
        moved: dict[int, _Pointer] = {}

        def put(h: int, p: _Pointer) -> None:
            old = moved.get(h)
            if h <= i and (old is None or (p.misses, -p.run) < (old.misses, -old.run)):
                moved[h] = p

        for h, p in self._pointers.items():
            run = min(p.run + 1, 1 << 16)
            if tokens[h] == x:
                put(h + 1, _Pointer(0, run, MATCHED))
            elif p.misses < self.max_misses:
                put(h + 1, _Pointer(p.misses + 1, p.run, SUBSTITUTION))
                put(h, _Pointer(p.misses + 1, p.run, INSERTION))
                if h + 1 < i and tokens[h + 1] == x:
                    put(h + 2, _Pointer(0, run, MATCHED))
        a = self.anchor
        if i + 1 >= a:
            key = tuple(tokens[i + 1 - a :])
            end = self._ends.get(key)
            if end is not None:
                put(end + 1, _Pointer(0, a, MATCHED))
            self._ends[key] = i
        kept = sorted(moved.items(), key=lambda hp: (hp[1].misses, -hp[1].run, -hp[0]))[: self.max_hypotheses]
        self._pointers = dict(kept)

    def observe(self, obs: Observation) -> None:
        self._sync(obs.context)

    def candidates(self, context: Sequence[int], max_tokens: int, limit: int) -> list[Candidate]:
        self._sync(context)
        if max_tokens < 1 or limit < 1:
            return []
        tokens = self._tokens
        out: list[Candidate] = []
        seen: set[tuple[int, ...]] = set()
        for h, p in self._pointers.items():  # best first (the order _extend kept them in)
            if p.misses == 0:
                continue
            guess = tuple(tokens[h : h + max_tokens])
            if not guess or guess in seen:
                continue
            seen.add(guess)
            feature = self._feature(p)
            out.append(Candidate(tokens=guess, source=self.name, feature=feature))
            if len(out) >= limit:
                break
        return out

    def _feature(self, p: _Pointer) -> int:
        if p.misses > 1:
            return 3
        if p.kind == INSERTION:
            return 2
        return 1 if p.run >= self.long_run else 0
