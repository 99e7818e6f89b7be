"""The lean forward (models/lean.py) computes every logit and cache entry with the model's own bits.

Each case runs one sequence of passes twice, through the model's own forward (LOOKAHEAD_LEAN_FORWARD=0)
and through the lean one, and requires bit-identical logits and caches: a prompt, a tree step whose
rows see only their ancestors (not causal), a step that keeps only some logit rows, and a batch of two
sequences of different lengths. Float32 and float64 tiny Llamas, with SDPA and with the engine's
exact attention (the latter over key views as well); bfloat16, where the lean path rotates q and k and
scales the norms on lookahead's kernel (engine/lean_kernel.cpp), which must give PyTorch's bits too.
"""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from lookahead.engine import exact_kernel
from lookahead.engine.attention import install
from lookahead.engine.kvcache import KVCache
from lookahead.engine.model_runner import ModelRunner, Rows
from lookahead.engine.numerics import KEY_ALIGN
from lookahead.models.dtypes import device_signature
from lookahead.models.lean import ENV, LANES, LeanDecoder, lean_decoder, norm_lanes
from lookahead.models.self_draft import SelfDraft
from lookahead.testing import tiny_model

# A tree of 5 rows after the root: 0 -> 1 -> 2 and 0 -> 3 -> 4 (row i sees itself and its ancestors)
TREE_PARENTS = (-1, 0, 1, 0, 3)


def _tree_local(parents: tuple[int, ...]) -> torch.Tensor:
    local = torch.eye(len(parents), dtype=torch.bool)
    for i, p in enumerate(parents):
        while p >= 0:
            local[i, p] = True
            p = parents[p]
    return local


def _passes(runner: ModelRunner, lm: object, views: bool) -> tuple[list[torch.Tensor], KVCache]:
    """The passes every case runs; returns the logits of each and the cache after them."""
    cache = KVCache(KEY_ALIGN, slots=2)
    out: list[torch.Tensor] = []
    cache.select(0, 1)
    runner.prefill(cache, list(range(3, 40)))
    n = cache.get_seq_length()
    depth = torch.tensor([0, 1, 2, 1, 2])
    tree = Rows(torch.tensor([7, 9, 11, 8, 12]), n + depth, _tree_local(TREE_PARENTS), torch.arange(5),
                views=(([3, 4], [0, 3, 4]),) if views else ())
    out += runner.forward_batch(cache, [tree])
    cache.crop(n - cache.get_seq_length())
    chain = Rows(torch.tensor([5, 6, 7]), torch.arange(n, n + 3), torch.ones(3, 3, dtype=torch.bool).tril_(),
                 torch.tensor([0, 2]))  # two of three logit rows kept, and every row's final hidden state
    out += runner.forward_batch(cache, [chain], states=True)
    assert runner.states is not None and runner.states.shape[:2] == (1, 3)
    out.append(runner.states[0])
    cache.select(1, 2)
    runner.prefill(cache, list(range(50, 61)))
    cache.select(0, 2)  # two sequences of different lengths in one pass
    m = cache.slot_lengths()
    both = [Rows(torch.tensor([1, 2]), torch.arange(length, length + 2), torch.ones(2, 2, dtype=torch.bool).tril_(),
                 torch.arange(2)) for length in m]
    out += runner.forward_batch(cache, both)
    return out, cache


def _layers(cache: KVCache) -> list[torch.Tensor]:
    return [t for layer in cache.layers for t in (layer.keys, layer.values)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("exact", [False, True])
def test_the_lean_forward_gives_the_models_own_bits(dtype: torch.dtype, exact: bool,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    lm = tiny_model("llama", dtype=dtype, seed=3)
    if exact:
        assert install(lm.model)
    results = {}
    for lean in ("0", "1"):
        monkeypatch.setenv(ENV, lean)
        runner = ModelRunner(lm.model, exact_attention=exact, views=exact)
        assert (runner.lean is not None) == (lean == "1")
        if runner.lean is not None:  # bfloat16 takes the kernel's rotary and norm scaling (it must build here)
            assert runner.lean._kernel_parts == (dtype == torch.bfloat16), exact_kernel.status()
            assert (runner.lean._lanes in LANES) == (dtype == torch.bfloat16)  # whole norms on the kernel
        results[lean] = _passes(runner, lm, views=exact)
    (own, own_cache), (fast, fast_cache) = results["0"], results["1"]
    assert len(own) == len(fast) == 5
    for a, b in zip(own, fast):
        assert a.shape == b.shape and torch.equal(a, b)
    assert own_cache.slot_lengths() == fast_cache.slot_lengths()
    for a, b in zip(_layers(own_cache), _layers(fast_cache)):
        assert torch.equal(a, b)


def test_every_layer_of_a_llama_runs_lean_and_other_families_run_their_own_forward(
        monkeypatch: pytest.MonkeyPatch) -> None:
    llama = tiny_model("llama", seed=0).model
    decoder = lean_decoder(llama)
    assert decoder is not None and decoder.lean_layers == llama.config.num_hidden_layers
    # families whose forward is not LlamaModel's (even where their layers look alike) keep their own
    for arch in ("qwen2", "qwen3", "mistral", "gpt2", "gemma3"):
        assert lean_decoder(tiny_model(arch, seed=0).model) is None, arch
    monkeypatch.setenv(ENV, "0")
    assert lean_decoder(llama) is None
    # timings are kept per forward: the device signature names the switch (memoised: its uncached body)
    assert device_signature.__wrapped__().endswith("|lean forward off")
    monkeypatch.setenv(ENV, "1")
    llama.train()
    assert lean_decoder(llama) is None  # training: dropout and the rest are the model's business
    llama.eval()
    llama.config._attn_implementation = "flash_attention_2"  # takes keywords the lean path does not pass
    assert lean_decoder(llama) is None
    llama.config._attn_implementation = "sdpa"


def test_a_hooked_layer_runs_as_its_module_and_the_rest_stay_lean() -> None:
    lm = tiny_model("llama", dtype=torch.float64, seed=1)
    seen: list[int] = []
    handle = lm.model.model.layers[1].mlp.register_forward_hook(lambda *a: seen.append(1))
    try:
        decoder = lean_decoder(lm.model)
        assert decoder is not None and decoder.lean == [True, False] + [True] * (len(decoder.lean) - 2)
        ids = torch.tensor([[5, 6, 7, 8]])
        pos = torch.arange(4)[None]
        own = lm.model(input_ids=ids, position_ids=pos).logits
        fast = decoder(input_ids=ids, position_ids=pos, attention_mask=None, cache=None)
        assert seen == [1, 1]  # the hook ran in both passes
        assert torch.equal(own, fast.logits)
        # a hook on the model itself: its own forward would run it, so the lean path stands aside
        top = lm.model.register_forward_pre_hook(lambda *a: None)
        assert lean_decoder(lm.model) is None
        top.remove()
    finally:
        handle.remove()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_lean_decoder_over_the_first_layers_is_the_models_first_layers(arch: str) -> None:
    # SelfDraft runs its layers through LeanDecoder: Llama layers lean, others as modules. Its logits are
    # the model's first L layers, final norm and LM head, as transformers computes them.
    lm = tiny_model(arch, dtype=torch.float64, seed=2)
    draft = SelfDraft(lm.model, 1)
    ids, pos = torch.tensor([[9, 10, 11]]), torch.arange(3)[None]
    inner = lm.model.model
    hidden = inner.embed_tokens(ids)
    cos_sin = inner.rotary_emb(hidden, pos)
    hidden = inner.layers[0](hidden, attention_mask=None, position_embeddings=cos_sin, position_ids=pos)
    expected = lm.model.lm_head(inner.norm(hidden))
    assert isinstance(draft._run, LeanDecoder) and draft._run.lean_layers == (1 if arch == "llama" else 0)
    assert torch.equal(draft(ids, pos, None).logits, expected)


def test_the_kernels_rotary_and_norm_scaling_are_pytorchs_to_the_bit() -> None:
    # Values across bfloat16's range, ties included (products whose rounding lands halfway), odd shapes:
    # 2 sequences x 3 rows, 4 query heads and 2 key heads of 16, q and k read as views of one wider
    # product (as the stacked projections hand them on), norms over rows of 48 with a large epsilon.
    kern = exact_kernel.kernel()
    assert kern is not None, exact_kernel.status()
    g = torch.Generator().manual_seed(0)
    wide = (torch.randn(2, 3, 4 * 16 + 2 * 16 + 8, generator=g) * torch.logspace(-3, 3, 104)).to(torch.bfloat16)
    q, k = wide[..., :64], wide[..., 64:96]
    angles = torch.randn(2, 3, 16, generator=g) * 50
    cos, sin = angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)
    cos[0, 0, :4] = torch.tensor([1.0, -1.0, 0.5, 0.0])  # exact products and a zero
    got_q, got_k = kern.rotary_qk(q, k, cos, sin, 16)
    want_q, want_k = apply_rotary_pos_emb(q.view(2, 3, -1, 16).transpose(1, 2), k.view(2, 3, -1, 16).transpose(1, 2),
                                          cos, sin)
    assert got_q.shape == (2, 4, 3, 16) and got_k.shape == (2, 2, 3, 16)
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)

    norm = LlamaRMSNorm(48, eps=1e-2).to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(48, generator=g) * 3)
    h = (torch.randn(5, 48, generator=g) * torch.logspace(-4, 4, 5)[:, None]).to(torch.bfloat16)
    variance = h.to(torch.float32).pow(2).mean(-1, keepdim=True)
    with torch.no_grad():
        assert torch.equal(kern.rms_scale(h, variance, norm.weight, norm.variance_epsilon), norm(h))
        # the whole norm, its variance summed in PyTorch's order (found by norm_lanes on this build)
        lanes = norm_lanes(kern, 48)
        assert lanes in LANES, "the kernel's sum matches none of PyTorch's vector widths on rows of 48"
        assert torch.equal(kern.variance(h, lanes), variance)
        assert torch.equal(kern.rms_norm(h, norm.weight, norm.variance_epsilon, lanes), norm(h))
    with pytest.raises(RuntimeError, match="bfloat16"):
        kern.rotary_qk(q.float(), k, cos, sin, 16)


def test_the_variance_is_summed_in_pytorchs_order_and_another_order_shows() -> None:
    # Widths with a scalar tail (100, 17), whole vectors past the last row of four (40 = 5 vectors of 8),
    # and one long enough for the sum's cascade of levels (70,000). Float32 variances, compared bit for bit.
    kern = exact_kernel.kernel()
    assert kern is not None, exact_kernel.status()
    g = torch.Generator().manual_seed(5)
    for width in (17, 40, 100, 576, 70_000):
        rows = (torch.randn(64, width, generator=g) * torch.logspace(-6, 6, 64)[:, None]).to(torch.bfloat16)
        want = rows.to(torch.float32).pow(2).mean(-1, keepdim=True)
        lanes = norm_lanes(kern, width)
        assert lanes in LANES and torch.equal(kern.variance(rows, lanes), want), width
        if width >= 100:  # the probe can tell orders apart: some other width of vectors sums otherwise
            assert any(not torch.equal(kern.variance(rows, other), want) for other in LANES if other != lanes)
