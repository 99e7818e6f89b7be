"""The prompt's pass: into an empty cache, SDPA's causal kernel over the prompt's own keys (a sliding-window
layer's banded to its window); after cached tokens, the 4-D mask."""

from __future__ import annotations

import contextlib

import pytest
import torch

from lookahead.engine import model_runner
from lookahead.engine.attention import install
from lookahead.engine.kvcache import KVCache
from lookahead.engine.model_runner import ModelRunner
from lookahead.engine.numerics import KEY_ALIGN

from .helpers import model64


def _spy_sdpa(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """A list that gains each SDPA call's is_causal (transformers looks the function up at every call)."""
    calls: list[bool] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(bool(kwargs.get("is_causal")))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return calls


def _prefill(arch: str, prompts: list[list[int]], masked: bool, monkeypatch: pytest.MonkeyPatch) -> KVCache:
    """A fresh cache after prefilling each of `prompts` in turn (the first into an empty cache); masked:
    every pass on the 4-D mask (the reference)."""
    lm = model64(arch)
    assert install(lm.model)  # the engine's attention, whose fused branch takes the causal kernel
    with monkeypatch.context() as m:
        if masked:
            m.setattr(model_runner, "causal_prompt", lambda rows, window_of=None, past=0: contextlib.nullcontext())
        runner, cache = ModelRunner(lm.model), KVCache(KEY_ALIGN)
        for prompt in prompts:
            runner.prefill(cache, prompt)
    return cache


def _assert_same_cache(mine: KVCache, ref: KVCache) -> None:
    assert mine.get_seq_length() == ref.get_seq_length()
    for a, b in zip(mine.layers, ref.layers):
        torch.testing.assert_close(a.keys, b.keys, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(a.values, b.values, rtol=1e-12, atol=1e-12)


def test_a_prompt_into_an_empty_cache_runs_the_causal_kernel_over_its_own_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    prompt = model64("llama").encode("the quick brown fox jumps", raw=True)  # 25 tokens: keys padded to 64
    calls = _spy_sdpa(monkeypatch)
    ref = _prefill("llama", [prompt], masked=True, monkeypatch=monkeypatch)
    assert calls and not any(calls)
    calls.clear()
    mine = _prefill("llama", [prompt], masked=False, monkeypatch=monkeypatch)
    layers = model64("llama").model.config.num_hidden_layers
    assert calls == [True] * layers  # every layer: causal, no mask
    _assert_same_cache(mine, ref)  # the same keys and values (float64: up to rounding)


def test_a_prompt_after_cached_tokens_keeps_the_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    # Rows of a pass after p cached tokens must see those p keys too: the causal kernel's upper-left
    # alignment would hide them, so only the first pass into an empty cache takes it.
    lm = model64("llama")
    first, more = lm.encode("abcabcabc", raw=True), lm.encode("defdef", raw=True)
    calls = _spy_sdpa(monkeypatch)
    mine = _prefill("llama", [first, more], masked=False, monkeypatch=monkeypatch)
    layers = lm.model.config.num_hidden_layers
    assert calls == [True] * layers + [False] * layers
    _assert_same_cache(mine, _prefill("llama", [first + more], masked=True, monkeypatch=monkeypatch))


def test_a_sliding_window_shorter_than_the_prompt_runs_a_banded_causal_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    # The tiny Gemma 3 has sliding_window 8 on three of its four layers (layer 3 is full attention). A
    # 7-token prompt is inside every window: every layer plain causal. A 12-token one is not: the
    # sliding layers get a banded mask over the prompt's own 12 keys (row i sees i-7..i), the full layer
    # stays plain causal, and the cache equals the one the model's own 4-D masks give.
    lm = model64("gemma3")
    kinds = lm.model.config.layer_types
    assert kinds.count("sliding_attention") == 3 and lm.model.config.sliding_window == 8
    masks: list[torch.Tensor | None] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        masks.append(kwargs.get("attn_mask"))  # type: ignore[arg-type]
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    for text in ("abcdefg", "abcdefghijkl"):
        prompt = lm.encode(text, raw=True)
        n = len(prompt)
        masks.clear()
        mine = _prefill("gemma3", [prompt], masked=False, monkeypatch=monkeypatch)
        for kind, mask in zip(kinds, masks):
            if kind == "full_attention" or n <= 8:
                assert mask is None, (text, kind)  # is_causal over the prompt's keys
            else:
                assert mask is not None and mask.shape[-2:] == (n, n)
                band = [[i - 8 < j <= i for j in range(n)] for i in range(n)]
                assert mask[0, 0].tolist() == band
        _assert_same_cache(mine, _prefill("gemma3", [prompt], masked=True, monkeypatch=monkeypatch))


def test_a_model_windowed_in_every_layer_bands_every_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    # The tiny Mistral has sliding_window 16 on every layer and no layer types (one mask for all): a
    # 59-token prompt gets the band in every layer, and the cache the model's own 4-D masks give.
    lm = model64("mistral")
    assert lm.model.config.sliding_window == 16 and getattr(lm.model.config, "layer_types", None) is None
    prompt = lm.encode("the quick brown fox jumps over the lazy dog again and again", raw=True)
    n = len(prompt)
    masks: list[torch.Tensor | None] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **kw: masks.append(kw.get("attn_mask")) or sdpa(*a, **kw))
    mine = _prefill("mistral", [prompt], masked=False, monkeypatch=monkeypatch)
    band = [[i - 16 < j <= i for j in range(n)] for i in range(n)]
    assert len(masks) == lm.model.config.num_hidden_layers
    assert all(m is not None and m[0, 0].tolist() == band for m in masks)
    _assert_same_cache(mine, _prefill("mistral", [prompt], masked=True, monkeypatch=monkeypatch))
