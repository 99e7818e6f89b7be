"""The prefill's causal attention kernel (engine/prefill_kernel.cpp, built with the exact kernel's extension).

It is compiled where the compiler targets AVX-512 BF16 (every machine CI and the benchmarks ran on). Where it
is not, these tests check the fallback instead: prompts keep SDPA's causal kernel, and the kernel refuses."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

from lookahead.engine import exact_kernel, model_runner
from lookahead.engine.attention import causal_prompt, exact_attention, install
from lookahead.engine.kvcache import KVCache
from lookahead.engine.model_runner import ModelRunner
from lookahead.engine.numerics import KEY_ALIGN
from lookahead.testing import tiny_model


def _supported() -> bool:
    module = exact_kernel.kernel()
    assert module is not None, f"the engine's C++ extension did not build here: {exact_kernel.status()}"
    return bool(module.prefill_supported())


def _inputs(heads: int, kv_heads: int, n: int, head_dim: int, extra_keys: int = 0, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, n, head_dim, generator=gen).bfloat16()
    k = torch.randn(1, kv_heads, n + extra_keys, head_dim, generator=gen).bfloat16()
    v = torch.randn(1, kv_heads, n + extra_keys, head_dim, generator=gen).bfloat16()
    return q, k, v


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, window: int = 0) -> torch.Tensor:
    """float64 causal attention over the first n keys (row i: keys i-window+1..i under a window), grouped
    heads: [1, n, H, D]."""
    n = q.shape[2]
    seen = torch.ones(n, n, dtype=torch.bool).tril_()
    if window:
        seen.triu_(1 - window)
    out = F.scaled_dot_product_attention(q.double(), k[:, :, :n].double(), v[:, :, :n].double(), attn_mask=seen,
                                         scale=scale, enable_gqa=True)
    return out.transpose(1, 2)


@pytest.mark.parametrize("heads, kv_heads, n, head_dim", [
    (9, 3, 1, 64), (9, 3, 7, 64), (9, 3, 16, 64), (9, 3, 17, 64), (9, 3, 300, 64),  # SmolLM2's heads
    (4, 1, 40, 256),  # gemma3-270m's
    (4, 4, 33, 16), (4, 2, 129, 32), (2, 1, 260, 128),  # tile, block and chunk edges: 8 rows, 16 and 128 keys
])
def test_the_kernel_is_causal_attention(heads: int, kv_heads: int, n: int, head_dim: int) -> None:
    # Against a float64 reference, the kernel is as close as PyTorch's own bfloat16 kernel (both round
    # their outputs to bfloat16; a wrong mask, head group or softmax would be off by ~0.1-1).
    q, k, v = _inputs(heads, kv_heads, n, head_dim, extra_keys=5, seed=n)  # keys past n (the cache's) are ignored
    scale = head_dim ** -0.5
    if not _supported():
        assert not exact_kernel.prefills(torch.bfloat16, head_dim)
        with pytest.raises(RuntimeError, match="AVX-512 BF16"):
            exact_kernel.kernel().causal_prefill(q, k, v, scale)
        return
    ours = exact_kernel.kernel().causal_prefill(q, k, v, scale)
    assert ours.shape == (1, n, heads, head_dim) and ours.dtype == torch.bfloat16
    ref = _reference(q, k, v, scale)
    sdpa = F.scaled_dot_product_attention(q, k[:, :, :n], v[:, :, :n], is_causal=True, scale=scale,
                                          enable_gqa=True).transpose(1, 2)
    ours_err = float((ours.double() - ref).abs().max())
    sdpa_err = float((sdpa.double() - ref).abs().max())
    assert ours_err <= 2 * sdpa_err + 2e-3, (ours_err, sdpa_err)
    # Row 0 sees key 0 alone: its softmax weight is exactly 1, so each head's output is its kv head's
    # first value, exactly.
    groups = heads // kv_heads
    for h in range(heads):
        torch.testing.assert_close(ours[0, 0, h], v[0, h // groups, 0], rtol=0, atol=0)


@pytest.mark.parametrize("n, window", [
    (40, 8), (40, 16), (40, 39), (300, 17), (300, 128), (300, 130), (530, 512), (260, 1),
])  # windows inside a 16-key block, on its edge, across a 128-key chunk, Gemma 3's 512, and one key
def test_the_kernel_keeps_a_sliding_window(n: int, window: int) -> None:
    # Row i sees keys i-window+1..i only (transformers' sliding-window layers). Against a float64
    # reference with that band, as close as the causal case; with window 1 each row sees its own key
    # alone, so its output is exactly its value.
    heads, kv_heads, head_dim = 4, 2, 64
    q, k, v = _inputs(heads, kv_heads, n, head_dim, extra_keys=3, seed=window)
    scale = head_dim ** -0.5
    if not _supported():
        with pytest.raises(RuntimeError, match="AVX-512 BF16"):
            exact_kernel.kernel().causal_prefill(q, k, v, scale, window)
        return
    ours = exact_kernel.kernel().causal_prefill(q, k, v, scale, window)
    ref = _reference(q, k, v, scale, window)
    causal_err = float((exact_kernel.kernel().causal_prefill(q, k, v, scale).double() - _reference(q, k, v, scale))
                       .abs().max())
    assert float((ours.double() - ref).abs().max()) <= 2 * causal_err + 2e-3
    assert float((ours.double() - _reference(q, k, v, scale)).abs().max()) > 0.05  # the window changed the rows
    if window == 1:
        for h in range(heads):
            torch.testing.assert_close(ours[0, :, h], v[0, h // 2, :n], rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="window must be"):
        exact_kernel.kernel().causal_prefill(q, k, v, scale, -1)


def test_the_kernel_reads_strided_heads() -> None:
    # transformers hands queries as a transposed view [1, H, n, D] of [1, n, H, D], and keys/values as
    # views into the cache's longer buffers: the kernel reads them through their strides.
    q, k, v = _inputs(6, 2, 45, 64, seed=3)
    if not _supported():
        assert not exact_kernel.prefills(torch.bfloat16, 64)
        return
    strided_q = q.transpose(1, 2).contiguous().transpose(1, 2)
    buffer_k = torch.zeros(1, 2, 256, 64, dtype=torch.bfloat16)
    buffer_v = torch.zeros(1, 2, 256, 64, dtype=torch.bfloat16)
    buffer_k[:, :, :45], buffer_v[:, :, :45] = k, v
    kern = exact_kernel.kernel()
    torch.testing.assert_close(kern.causal_prefill(strided_q, buffer_k[:, :, :45], buffer_v[:, :, :45], 0.125),
                               kern.causal_prefill(q, k, v, 0.125), rtol=0, atol=0)
    # a head size that is not contiguous is refused by the kernel; the attention function copies it first
    odd_q = q.transpose(2, 3).contiguous().transpose(2, 3)
    with pytest.raises(RuntimeError, match="contiguous head size"):
        kern.causal_prefill(odd_q, k, v, 0.125)
    with causal_prompt(45):
        out, _ = exact_attention(None, odd_q, buffer_k, buffer_v, None, scaling=0.125)
    torch.testing.assert_close(out, kern.causal_prefill(q, k, v, 0.125), rtol=0, atol=0)


def test_a_bfloat16_prompt_runs_the_kernel_in_every_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    # The tiny Llama in bfloat16 (4 heads over 2, head size 16): a prompt into an empty cache calls the
    # kernel once per layer and SDPA never; with LOOKAHEAD_PREFILL_KERNEL=0 it is SDPA's causal kernel,
    # and both cache about the same keys and values.
    lm = tiny_model("llama", dtype=torch.bfloat16, seed=0)
    assert install(lm.model)
    prompt = lm.encode("the quick brown fox jumps over the lazy dog", raw=True)
    layers = lm.model.config.num_hidden_layers

    def run(env: str) -> tuple[KVCache, int, list[bool]]:
        kernel_calls, sdpa_calls = [0], []
        real_kernel, real_sdpa = exact_kernel.kernel(), F.scaled_dot_product_attention

        class Counting:
            def __getattr__(self, name: str):
                if name == "causal_prefill":
                    kernel_calls[0] += 1
                return getattr(real_kernel, name)

        with monkeypatch.context() as m:
            m.setenv(exact_kernel.PREFILL_ENV, env)
            m.setattr(exact_kernel, "kernel", lambda: Counting())
            m.setattr(F, "scaled_dot_product_attention",
                      lambda *a, **kw: sdpa_calls.append(bool(kw.get("is_causal"))) or real_sdpa(*a, **kw))
            cache = KVCache(KEY_ALIGN)
            ModelRunner(lm.model).prefill(cache, prompt)
        return cache, kernel_calls[0], sdpa_calls

    fallback, calls, sdpa = run("0")
    assert calls == 0 and sdpa == [True] * layers
    mine, calls, sdpa = run("1")
    if _supported():
        assert calls == layers and sdpa == []
    else:
        assert calls == 0 and sdpa == [True] * layers
    for a, b in zip(mine.layers, fallback.layers):
        torch.testing.assert_close(a.keys.float(), b.keys.float(), rtol=0.05, atol=0.1)
        torch.testing.assert_close(a.values.float(), b.values.float(), rtol=0.05, atol=0.1)


def test_a_bfloat16_gemma3_prompt_past_the_window_runs_the_kernel_banded(monkeypatch: pytest.MonkeyPatch) -> None:
    # The tiny Gemma 3 in bfloat16 (head size 16; sliding window 8 on layers 0-2, layer 3 full): a 20-token
    # prompt runs the kernel in every layer, window 8 on the sliding ones and none on the full one, and
    # caches about what the model's own 4-D masks give (the masked pass, bfloat16 rounding apart).
    lm = tiny_model("gemma3", dtype=torch.bfloat16, seed=0)
    assert install(lm.model)
    prompt = lm.encode("the quick brown fox jumps over", raw=True)
    assert len(prompt) > 8
    if not _supported():
        assert not exact_kernel.prefills(torch.bfloat16, 16)
        return
    windows: list[int] = []
    real_kernel = exact_kernel.kernel()

    class Recording:
        def __getattr__(self, name: str):
            if name == "causal_prefill":
                return lambda q, k, v, scale, window=0, past=0: windows.append(window) or real_kernel.causal_prefill(
                    q, k, v, scale, window, past)
            return getattr(real_kernel, name)

    with monkeypatch.context() as m:
        m.setattr(exact_kernel, "kernel", lambda: Recording())
        mine = KVCache(KEY_ALIGN)
        ModelRunner(lm.model).prefill(mine, prompt)
    assert windows == [8, 8, 8, 0]
    with monkeypatch.context() as m:
        m.setattr(model_runner, "causal_prompt", lambda rows, window_of=None, past=0: contextlib.nullcontext())
        ref = KVCache(KEY_ALIGN)
        ModelRunner(lm.model).prefill(ref, prompt)
    for a, b in zip(mine.layers, ref.layers):
        torch.testing.assert_close(a.keys.float(), b.keys.float(), rtol=0.05, atol=0.1)
        torch.testing.assert_close(a.values.float(), b.values.float(), rtol=0.05, atol=0.1)


def test_float_prompts_and_a_switched_off_kernel_keep_sdpa(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not exact_kernel.prefills(torch.float32, 64)
    assert not exact_kernel.prefills(torch.float64, 64)
    assert not exact_kernel.prefills(torch.bfloat16, 72)  # not a multiple of 16
    monkeypatch.setenv(exact_kernel.PREFILL_ENV, "off")
    assert not exact_kernel.prefills(torch.bfloat16, 64)
