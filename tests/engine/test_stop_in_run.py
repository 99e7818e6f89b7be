"""An EOS or a stop string that falls inside a multi-token accepted run truncates exactly there.

A step accepts a run of tokens at once (guessed tokens the model agrees with, then its own next
token). The stop rules are applied token by token inside the run, so decoding must end on the very
token where autoregressive decoding ends, and the rest of the run must be dropped.

The cases are built so that the run is certain, not a matter of timing: float64, the speculation
gate off, and candidates that are accepted by construction:
- "speculative" with the target itself as the draft: every drafted token is the target's own greedy
  choice, so every step accepts its 4 drafted tokens plus the model's token (runs of 5);
- "lookahead" (Jacobi n-grams plus context n-grams, gate off): runs found on the free run of a few
  prompts; the first position that fits is used.

Method: decode once with no stop rule and record each step's run (the StepEvents). Pick a position k
that lies inside a run, not on its last token (so later tokens of the same run are accepted too), and
make it the stop: its token as the only EOS, or the two tokens ending at k as a stop string. Decoding
again must give the autoregressive tokens (= the free tokens up to k), the same earlier steps, and a
last step that is the free run cut right after k.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

import lookahead
from lookahead import LookaheadConfig, SpeculativeConfig
from lookahead.engine.calibration import Calibrator
from lookahead.models import LoadedModel

from .helpers import hf_greedy, model64

MAX_NEW = 40
PROMPTS = ["hello hello hello", "lorem ipsum dolor sit amet", "END END", "zzzzzzzz", "SELECT * FROM t WHERE",
           "abcabcabcabc", "one two three one two three one", "tick tock tick tock"]


def strategy_kwargs(strategy: str, lm: LoadedModel) -> dict[str, Any]:
    if strategy == "speculative":  # the target drafts for itself: every drafted token is accepted
        return {"strategy": "speculative", "draft": lm, "speculative": SpeculativeConfig(draft_tokens=4)}
    # a fresh calibrator per decode: its estimates order the tree's guesses, so the free decode and the
    # stopped one must start from the same state to take the same steps (a shared one learns in between).
    # First chains only (aligned_trees=False): the stop rules act on the accepted run whatever tree it
    # came from, and on these prompts a stop string that fits inside a run (a printable pair not seen
    # before, rare in the tiny model's text) turns up in a chain's runs
    return {"strategy": "lookahead", "lookahead": LookaheadConfig(2, 4, 4, sources=("context", "jacobi")), "adaptive": False,
            "calibrator": Calibrator(), "aligned_trees": False}


def runs_of(lm: LoadedModel, ids: list[int], stop: list[str], **kwargs: Any) -> tuple[list[list[int]], Any]:
    """Each step's accepted (and emitted) tokens, and the final result."""
    runs: list[list[int]] = []
    result = None
    for event in lookahead.stream_events(lm, ids, max_new_tokens=MAX_NEW, stop=stop, **kwargs):
        if event.token_ids:
            runs.append(event.token_ids)
        result = event.result
    return runs, result


def inside_runs(runs: list[list[int]], min_offset: int) -> list[tuple[int, int, int]]:
    """(k, step, offset) for every generated position k at offset >= min_offset of its step's run and
    not the run's last token."""
    out, k = [], 0
    for step, run in enumerate(runs):
        for offset in range(len(run)):
            if min_offset <= offset < len(run) - 1:
                out.append((k + offset, step, offset))
        k += len(run)
    return out


def find_case(
    lm: LoadedModel, strategy: str, min_offset: int, fits: Callable[[list[int], int], bool]
) -> tuple[list[int], list[list[int]], int, int, int]:
    """The first prompt and position k inside a multi-token run where `fits(free_tokens, k)`."""
    for text in PROMPTS:
        ids = lm.encode(text, raw=True)
        runs, _ = runs_of(lm, ids, [], **strategy_kwargs(strategy, lm))
        flat = [t for run in runs for t in run]
        for k, step, offset in inside_runs(runs, min_offset):
            if fits(flat, k):
                return ids, runs, k, step, offset
    raise AssertionError(f"no prompt gave a {strategy} run with a usable stop position; extend PROMPTS")


def assert_cut_inside(runs: list[list[int]], cut: list[list[int]], step: int, offset: int) -> None:
    assert cut[:-1] == runs[:step]  # the same steps up to the stopping one
    assert cut[-1] == runs[step][: offset + 1]  # which ends on the stop token ...
    assert len(runs[step]) > offset + 1 >= 1  # ... inside a run that had accepted more


@pytest.mark.parametrize("strategy", ["speculative", "lookahead"])
def test_eos_inside_an_accepted_run_truncates_there(strategy: str) -> None:
    lm = dataclasses.replace(model64("llama"), eos_token_ids=())
    # EOS must be the first occurrence of its token, or decoding would (rightly) stop earlier.
    ids, runs, k, step, offset = find_case(lm, strategy, 0, lambda flat, k: flat.index(flat[k]) == k)
    flat = [t for run in runs for t in run]
    eos = flat[k]
    lm_eos = dataclasses.replace(lm, eos_token_ids=(eos,))
    ar = lookahead.generate(lm_eos, ids, max_new_tokens=MAX_NEW, strategy="autoregressive")
    assert ar.token_ids == flat[: k + 1] == hf_greedy(lm, ids, MAX_NEW, eos=(eos,))
    cut, result = runs_of(lm_eos, ids, [], **strategy_kwargs(strategy, lm_eos))
    assert result.token_ids == ar.token_ids and result.text == ar.text
    assert result.finish_reason == "stop"
    assert_cut_inside(runs, cut, step, offset)


def _ascii(lm: LoadedModel, token: int) -> str | None:
    text = lm.tokenizer.decode([token])
    return text if len(text) == 1 and " " <= text <= "~" else None


@pytest.mark.parametrize("strategy", ["speculative", "lookahead"])
def test_stop_string_inside_an_accepted_run_truncates_there(strategy: str) -> None:
    lm = dataclasses.replace(model64("llama"), eos_token_ids=())

    def fits(flat: list[int], k: int) -> bool:
        # tokens k-1 and k are printable ASCII bytes (one character each), and their two characters
        # do not occur in the text before: the stop string completes exactly at token k
        pair = [_ascii(lm, flat[k - 1]), _ascii(lm, flat[k])]
        if None in pair:
            return False
        return "".join(pair) not in lm.tokenizer.decode(flat[:k])  # type: ignore[arg-type]

    # offset >= 1: both tokens of the stop string are in the same run
    ids, runs, k, step, offset = find_case(lm, strategy, 1, fits)
    flat = [t for run in runs for t in run]
    stop = lm.tokenizer.decode(flat[k - 1 : k + 1])
    free_text = lm.tokenizer.decode(flat)
    ar = lookahead.generate(lm, ids, max_new_tokens=MAX_NEW, strategy="autoregressive", stop=[stop])
    assert ar.token_ids == flat[: k + 1]  # autoregressive decoding stops on token k
    assert ar.finish_reason == "stop" and ar.text == free_text[: free_text.find(stop)]
    cut, result = runs_of(lm, ids, [stop, "never-there"], **strategy_kwargs(strategy, lm))
    assert result.token_ids == ar.token_ids and result.text == ar.text
    assert result.finish_reason == "stop" and stop not in result.text
    assert_cut_inside(runs, cut, step, offset)
