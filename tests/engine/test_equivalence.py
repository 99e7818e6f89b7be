"""Lossless, exactly: in float64, lookahead == autoregressive == transformers' generate(), token for token."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import lookahead
import lookahead.engine.step as step_module
from lookahead import LookaheadConfig
from lookahead.engine import sampling
from lookahead.engine.numerics import width_probe
from lookahead.testing import ARCHS

from .helpers import hf_greedy, model64, prompts, spy_key_views

# (W, N, G, context_ngrams): the paper's shape, the extremes (W=1, N=2, G=0), G far larger than the pool,
# and the pure Jacobi pool without context n-grams.
CONFIGS = [
    LookaheadConfig(4, 4, 4),
    LookaheadConfig(1, 2, 0),
    LookaheadConfig(1, 2, 1),
    LookaheadConfig(3, 5, 50, context_tokens=7),  # 1 + 3*4 + 50*7 = 363 rows at most (under 512)
    LookaheadConfig(2, 3, 2, context_ngrams=False),
]
MAX_NEW = 24


@pytest.mark.parametrize("arch", ARCHS)
def test_lookahead_equals_autoregressive_equals_generate(arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    lm = model64(arch)
    width_probe(lm.model)  # before the spy: the probe runs key views itself
    views = spy_key_views(monkeypatch)  # layers that recomputed a second chain over key views
    total_steps = total_tokens = 0
    for i, text in enumerate(prompts(20)):
        ids = lm.encode(text, raw=True)
        ar = lookahead.generate(lm, ids, max_new_tokens=MAX_NEW, strategy="autoregressive")
        assert ar.token_ids == hf_greedy(lm, ids, MAX_NEW), f"autoregressive != generate() on prompt {i}"
        assert ar.stats.steps == ar.stats.new_tokens
        cfg = CONFIGS[i % len(CONFIGS)]
        # odd prompts run with the speculation gate on (timing-dependent work, same tokens), even ones off
        # prompts 0, 1 mod 4: exact steps may verify a second chain over key views (float64: floor 1)
        la = lookahead.generate(lm, ids, max_new_tokens=MAX_NEW, lookahead=cfg, adaptive=i % 2 == 1,
                                key_views=i % 4 < 2)
        assert la.token_ids == ar.token_ids, f"{arch} prompt {i} {cfg}"
        assert la.text == ar.text and la.finish_reason == ar.finish_reason
        total_steps += la.stats.steps
        total_tokens += la.stats.new_tokens
    # the verification branch must have accepted something, or this test proves nothing
    assert total_tokens / total_steps > 1.1
    assert views, "no step verified a second chain over key views"


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_every_config_on_repetitive_prompt_accepts(arch: str) -> None:
    lm = model64(arch)
    ids = lm.encode("abcabcabcabcabcabcabcabc", raw=True)
    ar = lookahead.generate(lm, ids, max_new_tokens=40, strategy="autoregressive")
    for cfg in CONFIGS:
        la = lookahead.generate(lm, ids, max_new_tokens=40, lookahead=cfg, adaptive=False)
        assert la.token_ids == ar.token_ids, cfg
        if cfg.guesses > 0:
            assert la.stats.tokens_per_step > 1.0, cfg
            assert la.stats.guesses_accepted > 0


def test_gemma3_masks_stay_right_past_the_sliding_window() -> None:
    # tiny gemma3 has sliding_window=8 on 3 of its 4 layers; 120 tokens is 15 windows
    lm = model64("gemma3")
    ids = lm.encode("the window slides " * 4, raw=True)
    no_eos = dataclasses.replace(lm, eos_token_ids=())
    ar = lookahead.generate(no_eos, ids, max_new_tokens=120, strategy="autoregressive")
    assert ar.token_ids == hf_greedy(lm, ids, 120, eos=())
    la = lookahead.generate(no_eos, ids, max_new_tokens=120, lookahead=LookaheadConfig(3, 4, 4), adaptive=False)
    assert la.token_ids == ar.token_ids
    assert la.stats.tokens_per_step > 1.0


@pytest.mark.parametrize("arch", ["llama", "mistral", "gpt2"])
def test_eos_forced_mid_run(arch: str) -> None:
    lm = model64(arch)
    ids = lm.encode("abcabcabcabc tick tock tick tock", raw=True)
    free = lookahead.generate(dataclasses.replace(lm, eos_token_ids=()), ids, max_new_tokens=40,
                              strategy="autoregressive").token_ids
    eos = free[len(free) // 2]  # a token that certainly occurs mid-run
    first = free.index(eos)
    lm_eos = dataclasses.replace(lm, eos_token_ids=(eos,))
    for strategy in ("autoregressive", "lookahead"):
        r = lookahead.generate(lm_eos, ids, max_new_tokens=40, strategy=strategy)
        assert r.token_ids == free[: first + 1], strategy  # EOS included, nothing after it
        assert r.finish_reason == "stop"
    assert hf_greedy(lm, ids, 40, eos=(eos,)) == free[: first + 1]


def test_max_new_tokens_cuts_inside_an_accepted_run() -> None:
    lm = model64("llama")
    ids = lm.encode("abcabcabcabcabcabcabcabc", raw=True)
    full = lookahead.generate(lm, ids, max_new_tokens=40, strategy="autoregressive").token_ids
    runs = lookahead.generate(lm, ids, max_new_tokens=40, adaptive=False)
    assert runs.stats.tokens_per_step > 1.5  # so most cut points fall inside a multi-token run
    for k in range(1, 20):
        r = lookahead.generate(lm, ids, max_new_tokens=k, adaptive=False)
        assert r.token_ids == full[:k]
        assert r.finish_reason == "length" or full[k - 1] in lm.eos_token_ids


def test_stop_strings_truncate_where_autoregressive_stops() -> None:
    lm = model64("qwen2")
    ids = lm.encode("one two three one two three one", raw=True)
    free = lookahead.generate(lm, ids, max_new_tokens=40, strategy="autoregressive")
    text = free.text
    assert len(text) > 10
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    for strategy in ("autoregressive", "lookahead"):
        r = lookahead.generate(lm, ids, max_new_tokens=40, strategy=strategy, stop=[stop, "never-there"])
        assert r.finish_reason == "stop"
        assert r.text == text[: text.find(stop)]
        assert stop not in r.text
    a = lookahead.generate(lm, ids, max_new_tokens=40, strategy="autoregressive", stop=[stop])
    b = lookahead.generate(lm, ids, max_new_tokens=40, stop=[stop])
    assert a.token_ids == b.token_ids


# Every free source alone, and all of them together, each greedy and seeded-sampled.
SOURCE_SETS = [("recycle",), ("suffix",), ("context",), ("jacobi",), ("resume",),
               ("context", "suffix", "recycle", "cache", "jacobi", "resume")]


@pytest.mark.parametrize("arch", ARCHS)
def test_every_source_is_lossless_greedy_and_sampled(arch: str) -> None:
    lm = model64(arch)
    accepted: dict[str, int] = {}
    for i, text in enumerate(prompts(10)):
        ids = lm.encode(text, raw=True)
        sources = SOURCE_SETS[i % len(SOURCE_SETS)]
        cache = lookahead.NGramCache()
        cache.add_response(ids[:4], ids)  # the cache source gets something to offer
        for sampling in (lookahead.SamplingConfig(), lookahead.SamplingConfig(temperature=0.9, top_p=0.95, seed=i)):
            ar = lookahead.generate(lm, ids, max_new_tokens=MAX_NEW, strategy="autoregressive", sampling=sampling)
            la = lookahead.generate(lm, ids, max_new_tokens=MAX_NEW, lookahead=LookaheadConfig(sources=sources),
                                    sampling=sampling, adaptive=i % 2 == 0, ngram_cache=cache)
            assert la.token_ids == ar.token_ids, f"{arch} prompt {i} sources {sources} {sampling}"
            for source, n in la.stats.accepted_by_source.items():
                accepted[source] = accepted.get(source, 0) + n
    # each source got guesses accepted somewhere, or its equivalence proves little
    assert {"recycle", "suffix", "context", "jacobi"} <= {s for s, n in accepted.items() if n > 0}, accepted


# Text that copies a line and changes one byte of it, so that the resume source's pointers split.
RESUME_PROMPTS = ["ab12cd34ef ab12cd34ef ab12cX34ef ab12cd3", "x = 1 + 2; y = 1 + 3; z = 1 + 2; w = 1 +",
                  "0123456789 0123456789 0123406789 01234"]


def test_resumed_copies_are_lossless_where_they_are_accepted() -> None:
    # The resume source alone, verified as proposed (adaptive=False), greedy and seeded-sampled, on every
    # architecture: its guesses must land in both modes, or the equality below proves little about them.
    # (The tiny models' logits are flat: at temperature 0.1 the seeded rule still draws another text
    # than greedy, and one that copies enough for resumed guesses to land.)
    accepted = {"greedy": 0, "sampled": 0}
    for arch in ARCHS:
        lm = model64(arch)
        for i, text in enumerate(RESUME_PROMPTS):
            ids = lm.encode(text, raw=True)
            for mode, sampling in (("greedy", lookahead.SamplingConfig()),
                                   ("sampled", lookahead.SamplingConfig(temperature=0.1, seed=i))):
                ar = lookahead.generate(lm, ids, max_new_tokens=MAX_NEW, strategy="autoregressive", sampling=sampling)
                la = lookahead.generate(lm, ids, max_new_tokens=MAX_NEW, lookahead=LookaheadConfig(sources=("resume",)),
                                        sampling=sampling, adaptive=False)
                assert la.token_ids == ar.token_ids, f"{arch} prompt {i} {sampling}"
                accepted[mode] += la.stats.accepted_by_source.get("resume", 0)
    assert min(accepted.values()) > 0, f"resumed guesses accepted: {accepted}"


@pytest.mark.parametrize("arch", ARCHS)
def test_steps_reading_the_top_k_in_two_passes_stay_lossless(arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The tiny models' 259 tokens take one torch.topk (engine/sampling.largest: small vocabularies); with
    # blocks of 2 logits and no size limit the two-pass path reads every step's top-8 (recycled
    # successors, the greedy token off them) and the sampling rule's top-k cut: lookahead must still
    # equal autoregressive.
    monkeypatch.setattr(sampling, "BLOCK", 2)
    monkeypatch.setattr(sampling, "TWO_PASS_FROM", 0)
    lm = model64(arch)
    assert 8 * sampling.BLOCK * 4 <= lm.model.get_output_embeddings().weight.shape[0]
    passes: list[int] = []
    two_pass = sampling.largest

    def spy(logits: torch.Tensor, k: int) -> sampling.Largest:
        passes.append(logits.shape[0])
        return two_pass(logits, k)

    monkeypatch.setattr(step_module, "largest", spy)
    recycled = 0
    for i, text in enumerate(prompts(6)):
        ids = lm.encode(text, raw=True)
        for rule in (lookahead.SamplingConfig(), lookahead.SamplingConfig(temperature=0.8, top_k=12, seed=i)):
            ar = lookahead.generate(lm, ids, max_new_tokens=MAX_NEW, strategy="autoregressive", sampling=rule)
            la = lookahead.generate(lm, ids, max_new_tokens=MAX_NEW, sampling=rule)
            assert la.token_ids == ar.token_ids, f"{arch} prompt {i} {rule}"
            recycled += la.stats.accepted_by_source.get("recycle", 0)
    assert passes and max(passes) > 1, "no step read its rows' top-k"
    assert recycled > 0, "no recycled guess was accepted: the successors read in two passes went unused"
