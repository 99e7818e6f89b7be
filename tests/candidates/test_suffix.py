"""Hand-written cases for the suffix-match source (candidates/suffix.py), then a randomised comparison
with a brute-force reference. In the comments, T is the indexed text, n = len(T), positions are
0-based, and "p matches m" means the m tokens ending at p equal the last m tokens of T (p <= n - 2).

Feature = 3 * length bucket (1 -> 0, 2 -> 1, 3-4 -> 2, 5-8 -> 3, 9+ -> 4) + share bucket of the
first token (>= 0.8 -> 0, >= 0.5 -> 1, else 2); these cases report no hidden states, so no path is
flagged as the nearest occurrence's (+15; tests/candidates/test_states.py).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

import pytest

from lookahead.candidates.suffix import SuffixSource, feature_of
from lookahead.engine.sources import Candidate, CandidateSource, Observation


def toks(cands: list[Candidate]) -> list[tuple[int, ...]]:
    return [c.tokens for c in cands]


def assert_well_formed(cands: list[Candidate], max_tokens: int, limit: int) -> None:
    paths = toks(cands)
    assert len(paths) <= limit
    assert all(1 <= len(p) <= max_tokens for p in paths)
    assert all(c.source == "suffix" and 0 <= c.feature < 64 for c in cands)
    for i, a in enumerate(paths):
        for j, b in enumerate(paths):
            assert i == j or a != b[:len(a)], f"{a} is a prefix of {b}"


def test_is_a_candidate_source() -> None:
    assert isinstance(SuffixSource([1, 2]), CandidateSource)
    assert SuffixSource([]).name == "suffix"


def test_longest_match_wins_over_shorter() -> None:
    # T = 7 2 3 10 1 2 3 11 1 2 3. The suffix "1 2 3" ended at p=6 (then 11); only "2 3" ended at
    # p=2 (then 10). The longest match (3 tokens) comes first: 11 then what followed it, "1 2 3".
    # Level k=2 (matches of 2..2 tokens) then adds the path after p=2, whose first token 10 is new.
    text = [7, 2, 3, 10, 1, 2, 3, 11, 1, 2, 3]
    src = SuffixSource(text)
    assert toks(src.candidates(text, 4, 1)) == [(11, 1, 2, 3)]
    cands = src.candidates(text, 2, 5)
    assert toks(cands) == [(11, 1), (10, 1)]
    # Level 0: match 3, one occurrence, share 1.0 -> 3*2+0; level k=2: match 2 -> 3*1+0.
    assert [c.feature for c in cands] == [6, 3]


def test_counts_order_candidates() -> None:
    # T = 5 6 5 6 5 6 5 7 5: every earlier 5 (p=0, 2, 4, 6) matches 1 token ("6 5" vs "7 5" differ).
    # 6 followed three of them, 7 only the newest one: 6 comes first despite being older.
    text = [5, 6, 5, 6, 5, 6, 5, 7, 5]
    cands = SuffixSource(text).candidates(text, 1, 8)
    assert toks(cands) == [(6,), (7,)]
    # Shares 3/4 (bucket 1) and 1/4 (bucket 2); match length 1 (bucket 0).
    assert [c.feature for c in cands] == [1, 2]


def test_ties_broken_by_recency() -> None:
    # T = 5 6 5 7 5: 6 and 7 each followed one earlier 5; 7 did so more recently.
    text = [5, 6, 5, 7, 5]
    assert toks(SuffixSource(text).candidates(text, 3, 8)) == [(7, 5), (6, 5, 7)]


def test_deeper_branches_by_count_share() -> None:
    # T = 1 2 3 | 1 2 4 | 1 2 3 | 1 2 3 | 1: four earlier 1s, all followed by 2, then 3 three
    # times and 4 once. The greedy path is 2 3 1 (newest of the three); the branch at depth 2 (4)
    # is next. Continuations are cut at max_tokens=3, so the 3-branch is one leaf.
    text = [1, 2, 3, 1, 2, 4, 1, 2, 3, 1, 2, 3, 1]
    assert toks(SuffixSource(text).candidates(text, 3, 8)) == [(2, 3, 1), (2, 4, 1)]


def test_no_self_match() -> None:
    # The only occurrence of the suffix is the end itself: nothing followed it, no candidates.
    for text in ([], [5], [1, 2, 3, 4], [1, 2, 3, 1, 2, 3, 9]):
        assert SuffixSource(text).candidates(text, 4, 4) == []
    # T = 4 4: p=0 matches 1 and was followed by the root itself, so the guess is "4".
    assert toks(SuffixSource([4, 4]).candidates([4, 4], 4, 4)) == [(4,)]


def test_continuation_runs_into_the_end() -> None:
    # T = 9 1 1 1: p=2 matches "1 1" (two tokens, the longest); what followed it is just the root 1.
    # Level k=1 (matches of exactly 1 token: p=1) would start with 1 too, so it adds nothing new.
    text = [9, 1, 1, 1]
    assert toks(SuffixSource(text).candidates(text, 4, 4)) == [(1,)]


def test_max_tokens_and_limit_respected() -> None:
    # A bushy text: after 0 comes every other token, each followed by long runs.
    rng = random.Random(3)
    text = [t for i in range(40) for t in (0, i % 9 + 1, *rng.choices(range(10, 14), k=6))] + [0]
    src = SuffixSource(text)
    for max_tokens in (1, 2, 5):
        for limit in (1, 3, 8):
            cands = src.candidates(text, max_tokens, limit)
            assert len(cands) == limit  # nine distinct successors of 0 are available
            assert_well_formed(cands, max_tokens, limit)
    assert src.candidates(text, 0, 4) == [] and src.candidates(text, 4, 0) == []


def test_observe_extends_the_index() -> None:
    # The prompt has no repeat. Generated text "5 6 7" is then produced twice in part: after
    # observing 5 6 7 8 5 6, the suffix "5 6" matches generated text at p=2 and 7 8 5 6 follows.
    src = SuffixSource([1, 2])
    assert src.candidates([1, 2], 4, 4) == []
    context = [1, 2, 5, 6, 7, 8]
    src.observe(Observation(context=context, accepted=[5, 6, 7, 8]))
    context = context + [5, 6]
    src.observe(Observation(context=context, accepted=[5, 6]))
    assert toks(src.candidates(context, 4, 4)) == [(7, 8, 5, 6)]
    # candidates() also indexes tokens it has not observed yet: now "5 6 7" matches 3 tokens.
    assert toks(src.candidates(context + [7], 2, 4)) == [(8, 5)]


def test_a_context_that_does_not_extend_the_index_rebuilds_it() -> None:
    # Another request: its text shares nothing with the first, so the first text is forgotten.
    src = SuffixSource([1, 2, 3, 1, 2])
    assert toks(src.candidates([1, 2, 3, 1, 2], 1, 4)) == [(3,)]
    assert toks(src.candidates([7, 2, 9, 2], 1, 4)) == [(9,)]


def test_another_text_ending_alike_rebuilds_the_index() -> None:
    # T = 5 6 5 6 5 (then 6 after every 5). The second text has T's length and ends in 5 too, but its
    # 5 was followed by 8, not 6: it is not T continued, so only its own text is indexed.
    src = SuffixSource([5, 6, 5, 6, 5])
    assert toks(src.candidates([5, 6, 5, 6, 5], 1, 4)) == [(6,)]
    assert toks(src.candidates([3, 5, 8, 4, 5], 1, 4)) == [(8,)]
    # Past the last 8 tokens only the first is compared. T = 1 2 .. 10 1: the last 1 matches p=0 (then
    # 2). A text that differs from T in its first token only (11 for 1) has no earlier 1 to match.
    text = list(range(1, 11)) + [1]
    src = SuffixSource(text)
    assert toks(src.candidates(text, 1, 4)) == [(2,)]
    assert toks(src.candidates([11] + text[1:], 1, 4)) == []


def test_a_shorter_context_rebuilds_the_index() -> None:
    # The text went back to 1 2 3 1: only p=0 matches, 2 3 follows (the dropped "2" is forgotten).
    src = SuffixSource([1, 2, 3, 1, 2])
    assert toks(src.candidates([1, 2, 3, 1], 2, 4)) == [(2, 3)]


def test_max_scan_bounds_the_positions_looked_at() -> None:
    # T = 5 6 5 7 5 with max_scan=1: only the newest earlier 5 (p=2, then 7) is looked at.
    text = [5, 6, 5, 7, 5]
    assert toks(SuffixSource(text, max_scan=1).candidates(text, 2, 8)) == [(7, 5)]


def test_fallback_uses_at_most_fallback_occurrences() -> None:
    # T = 3 1 | 4 1 | 5 1 | 2 1 | 9 2 1: "2 1" matched at p=7 (then 9). Shorter level k=1: the 1s at
    # p=5, 3, 1 (newest first) match only 1 token; with fallback_occurrences=2 only p=5 (then 2) and
    # p=3 (then 5) are used, so 4 (after p=1) never appears.
    text = [3, 1, 4, 1, 5, 1, 2, 1, 9, 2, 1]
    assert toks(SuffixSource(text, fallback_occurrences=2).candidates(text, 1, 8)) == [(9,), (2,), (5,)]
    assert toks(SuffixSource(text, fallback_occurrences=0).candidates(text, 1, 8)) == [(9,)]


def test_feature_buckets_differ_for_long_and_short_matches() -> None:
    # A 10-token phrase seen once before: match 10 (bucket 4), share 1.0 -> 12.
    phrase = list(range(20, 30))
    long_text = phrase + [99] + phrase
    long_cands = SuffixSource(long_text).candidates(long_text, 1, 1)
    # Only the last token seen once before: match 1 (bucket 0), share 1.0 -> 0.
    short_text = [40, 41, 42, 41]
    short_cands = SuffixSource(short_text).candidates(short_text, 1, 1)
    assert toks(long_cands) == [(99,)] and toks(short_cands) == [(42,)]
    assert long_cands[0].feature == 12 and short_cands[0].feature == 0
    assert [feature_of(m, 1.0) for m in (1, 2, 3, 4, 5, 8, 9, 32)] == [0, 3, 6, 6, 9, 9, 12, 12]
    assert [feature_of(1, s) for s in (1.0, 0.8, 0.79, 0.5, 0.49)] == [0, 0, 1, 1, 2]


def test_max_match_caps_the_match_length() -> None:
    # With max_match=2 the 10-token phrase counts as a 2-token match (bucket 1) -> feature 3.
    phrase = list(range(20, 30))
    text = phrase + [99] + phrase
    assert [c.feature for c in SuffixSource(text, max_match=2).candidates(text, 1, 1)] == [3]


# ------------------------------------------------------------------ brute-force reference


def _bucket(match_len: int, share: float) -> int:
    length = 0 if match_len == 1 else 1 if match_len == 2 else 2 if match_len <= 4 else 3 if match_len <= 8 else 4
    return 3 * length + (0 if share >= 0.8 else 1 if share >= 0.5 else 2)


def reference(text: Sequence[int], max_match: int, max_occurrences: int, fallback_occurrences: int,
              max_tokens: int, limit: int) -> list[tuple[tuple[int, ...], int]]:
    """Scan every earlier end position for its match length, then build each level's full trie."""
    n = len(text)

    def match_len(p: int) -> int:
        m = 0
        while m < min(max_match, p + 1) and text[p - m] == text[n - 1 - m]:
            m += 1
        return m

    ms = [match_len(p) for p in range(n - 1)]
    longest = max(ms, default=0)
    if longest == 0:
        return []
    keys = [k for k in (1, 2, 4, 8, 16, 32, 64) if k <= max_match]
    levels = [(longest, longest, n + 1)]  # (feature length, lowest match, excluded match)
    for k in reversed(keys):
        if k < levels[-1][1]:
            levels.append((k, k, levels[-1][1]))
    out: list[tuple[tuple[int, ...], int]] = []
    budget = max_occurrences
    for length, low, high in levels:
        if len(out) >= limit or budget <= 0:
            break
        occ = [p for p in range(n - 2, -1, -1) if low <= ms[p] < high][:budget]
        # Shorter levels share what level 0 left of max_occurrences, at most fallback_occurrences.
        budget = min(budget - len(occ), fallback_occurrences) if low == longest else budget - len(occ)
        if not occ:
            continue
        firsts = {path[0] for path, _ in out}
        conts = [tuple(text[p + 1:p + 1 + max_tokens]) for p in occ]
        count: Counter[tuple[int, ...]] = Counter()
        newest: dict[tuple[int, ...], int] = {}
        for rank, cont in enumerate(conts):
            if cont[0] in firsts:
                continue
            for d in range(1, len(cont) + 1):
                count[cont[:d]] += 1
                newest.setdefault(cont[:d], rank)

        def order(node: tuple[int, ...]) -> tuple[int, int]:
            return (-count[node], newest[node])

        def kids(node: tuple[int, ...]) -> list[tuple[int, ...]]:
            return sorted((c for c in count if len(c) == len(node) + 1 and c[:-1] == node), key=order)

        heads = [c for c in count if kids(c[:-1])[0] != c]
        paths = []
        for head in [()] + sorted(heads, key=order):
            path = head
            while kids(path):
                path = kids(path)[0]
            if path:
                paths.append(path)
        out += [(path, _bucket(length, count[path[:1]] / len(occ))) for path in paths[:limit - len(out)]]
    return out


@pytest.mark.parametrize("seed", range(8))
def test_matches_brute_force_reference(seed: int) -> None:
    # Random texts over a small vocabulary (many repeats), indexed incrementally through observe().
    rng = random.Random(seed)
    for _ in range(6):
        vocab = rng.randint(2, 5)
        text = rng.choices(range(vocab), k=rng.randint(1, 90))
        max_match = rng.choice([1, 2, 3, 5, 8, 32])
        max_occurrences, fallback = rng.choice([1, 2, 5, 64]), rng.choice([0, 1, 3, 16])
        start = rng.randint(0, len(text))
        src = SuffixSource(text[:start], max_match=max_match, max_occurrences=max_occurrences,
                           fallback_occurrences=fallback, max_scan=10**9)
        for end in range(start, len(text) + 1):
            if end > start:
                src.observe(Observation(context=text[:end], accepted=text[start if end == start else end - 1:end]))
            max_tokens, limit = rng.randint(1, 6), rng.randint(1, 8)
            got = [(c.tokens, c.feature) for c in src.candidates(text[:end], max_tokens, limit)]
            want = reference(text[:end], max_match, max_occurrences, fallback, max_tokens, limit)
            assert got == want, (text[:end], max_match, max_occurrences, fallback, max_tokens, limit)
