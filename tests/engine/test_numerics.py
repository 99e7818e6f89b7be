"""Exact steps at reduced precision: the width probe, padding, key alignment, the exact attention, and
bfloat16 lookahead == bfloat16 autoregressive decoding bit for bit on every tiny architecture."""

from __future__ import annotations

import functools

import pytest
import torch

import lookahead
from lookahead import LookaheadConfig, SamplingConfig
from lookahead.engine.attention import install
from lookahead.engine.kvcache import KVCache
from lookahead.engine.model_runner import ModelRunner
from lookahead.engine.numerics import KEY_ALIGN, plain_linears, probe_width_floor, width_probe
from lookahead.errors import ConfigError
from lookahead.models.packing import pack_linears
from lookahead.testing import ARCHS, tiny_model

from .helpers import (WidthDependent, kernel_off, model64, prompts, spy_aligned_branches, spy_branches,
                      spy_key_views)


@functools.lru_cache(maxsize=None)
def model16(arch: str) -> lookahead.LoadedModel:
    return tiny_model(arch, dtype=torch.bfloat16, seed=1)


def _lookahead_equals_autoregressive(lm: lookahead.LoadedModel, n_prompts: int, arch: str,
                                     **options: object) -> int:
    """Greedy and seeded-sampled prompts, lookahead with `options(i)` against autoregressive decoding;
    returns the guesses accepted (a test that accepts none proves nothing)."""
    accepted = 0
    for i, text in enumerate(prompts(n_prompts)):
        ids = lm.encode(text, raw=True)
        sampling = SamplingConfig(temperature=0.9, top_p=0.95, seed=i) if i % 3 == 2 else None
        ar = lookahead.generate(lm, ids, max_new_tokens=32, strategy="autoregressive", sampling=sampling)
        kwargs = {k: v(i) if callable(v) else v for k, v in options.items()}
        la = lookahead.generate(lm, ids, max_new_tokens=32, lookahead=LookaheadConfig(2, 4, 4), sampling=sampling,
                                **kwargs)  # type: ignore[arg-type]
        assert la.token_ids == ar.token_ids, f"{arch} prompt {i}"
        assert (ar.dtype, ar.width_floor) == ("bfloat16", width_probe(lm.model).floor) == (la.dtype, la.width_floor)
        accepted += la.stats.guesses_accepted
    return accepted


@pytest.mark.parametrize("arch", ARCHS)
def test_bf16_lookahead_equals_bf16_autoregressive(arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # key views on the matmul path (the C++ kernel's passes need none: the tests below)
    kernel_off(monkeypatch)
    lm = model16(arch)
    probe = width_probe(lm.model)
    assert probe.floor is not None and probe.exact_attention and probe.tree_exact, probe
    views = spy_key_views(monkeypatch)  # layers that recomputed branches over key views
    accepted = _lookahead_equals_autoregressive(lm, 12, arch, adaptive=False, key_views=lambda i: i % 2 == 0)
    assert accepted > 0, "no guess was accepted: the test would prove nothing"
    assert views, "no step verified a branch off its first chain: the test would prove nothing of trees"


@pytest.mark.parametrize("kernel", ["kernel", "matmuls"])
@pytest.mark.parametrize("arch", ARCHS)
def test_bf16_aligned_trees_equal_bf16_autoregressive(arch: str, kernel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # whole trees, greedy and seeded sampling, every draft verified as proposed (wide trees): the same
    # tokens as autoregressive decoding. On the C++ kernel laid out gap-free (its attention does not see
    # masked keys between a row's visible ones); on the matmul path with their keys at aligned offsets
    # (engine/query.py align_tree).
    if kernel == "matmuls":
        kernel_off(monkeypatch)
    lm = model16(arch)
    probe = width_probe(lm.model)
    assert probe.aligned_exact and (kernel == "matmuls" or probe.gap_invariant), probe
    placed, branches = spy_aligned_branches(monkeypatch), spy_branches(monkeypatch)
    accepted = _lookahead_equals_autoregressive(lm, 10, arch, adaptive=lambda i: i % 2 == 0, aligned_trees=True)
    assert accepted > 0, "no guess was accepted: the test would prove nothing"
    assert branches, "no pass verified a branch off its first chain: the test would prove nothing of trees"
    if kernel == "kernel":
        assert not placed, "gap-free trees went through indexed copies"
    else:
        assert "gap" in placed, "no pass placed a branch at an aligned offset"
        assert "in order" not in placed, "a chain's keys went through indexed copies instead of one block write"


def test_float64_models_probe_as_width_invariant() -> None:
    # float64 with the exact attention: every width from a small floor computes every row the same. MKL's
    # float64 matmuls computed rows of passes under 4 rows in other last bits on a Xeon with AMX (1e-16;
    # seen once every row of every pass was compared, not just the first two), so the floor may be up to 4;
    # on Zen 4 they computed a pass's last w % 4 rows otherwise, so passes there run at multiples of 4.
    probe = width_probe(model64("llama").model)
    assert probe.floor is not None and probe.floor <= 4 and probe.ceiling is None, probe
    assert probe.quantum in (1, 2, 4) and probe.floor % probe.quantum == 0, probe
    assert probe.exact_attention and probe.gap_invariant and probe.tree_exact


def _planted(below: int | None, total: bool = False) -> lookahead.LoadedModel:
    lm = tiny_model("llama", dtype=torch.float64, seed=2)
    lm.model.model.norm.register_forward_hook(WidthDependent(below, 1e-3, total).hook)
    return lm


def test_a_plain_linear_layer_keeps_the_floor_at_2_and_packed_layers_allow_1() -> None:
    # The tiny Gemma 3 in bfloat16, unpacked: its rows probe alike at every width from 1, but PyTorch's own
    # linear computes a single row with another kernel, and on heavy-tailed rows some of its layers give
    # a row other bits alone than as the first of two (4 of 256 rows in one layer on Zen 4; normal rows:
    # none). So the floor is 2, not 1.
    lm = tiny_model("gemma3", dtype=torch.bfloat16, seed=1)
    assert plain_linears(lm.model)
    gen = torch.Generator().manual_seed(0)
    alone = 0
    for layer in (m for m in lm.model.modules() if type(m) is torch.nn.Linear):
        n = layer.in_features
        x = (torch.randn(257, n, generator=gen) * torch.exp(2 * torch.randn(257, n, generator=gen))).bfloat16()
        with torch.no_grad():
            alone += sum(not torch.equal(layer(x[i : i + 1])[0], layer(x[i : i + 2])[0]) for i in range(256))
    assert alone > 0  # what the rule guards against
    assert probe_width_floor(lm.model, max_width=24).floor == 2
    # Packed, a single row runs as the first of two (models/packing.py): where no plain layer is left (every
    # shape here; packing refuses a shape that would cost exactness) the probe's floor stands as measured.
    assert pack_linears(lm.model)
    assert probe_width_floor(lm.model, max_width=24).floor == (2 if plain_linears(lm.model) else 1)


def test_probe_finds_a_planted_floor() -> None:
    # planted at 8, a multiple of every quantum the float64 models take (see above): the floor is 8 whatever it is
    probe = probe_width_floor(_planted(8).model, max_width=24)
    assert probe.floor == 8, probe
    assert all(probe.diffs[w] > 0 for w in range(1, 8)) and all(probe.diffs[w] == 0 for w in probe.diffs if w >= 8)


def _planted16(below: int, total: bool) -> lookahead.LoadedModel:
    """bfloat16 (the tiny models' batched rows are bit-identical there; float64 batched matmuls are not)."""
    lm = tiny_model("llama", dtype=torch.bfloat16, seed=1)
    lm.model.model.norm.register_forward_hook(WidthDependent(below, 1.0, total).hook)
    return lm


def test_probe_says_whether_batched_sequences_may_share_the_floor() -> None:
    # A kernel that picks its path by the rows of the whole pass (B * Q): four one-row sequences
    # together are as exact as one sequence padded to 4 rows, so the batch needs no padding per sequence.
    shared = probe_width_floor(_planted16(4, total=True).model, 24)
    assert shared.floor == 4 and shared.batch_exact
    # A kernel that goes by each sequence's own rows: batching does not help; every sequence is padded.
    own = probe_width_floor(_planted16(4, total=False).model, 24)
    assert own.floor == 4 and not own.batch_exact
    # float64 batched matmuls differ from lone ones in the last bits: no sharing claimed there
    assert not probe_width_floor(_planted(4, total=True).model, 24).batch_exact
    for lm, probe in ((_planted16(4, True), shared), (_planted16(4, False), own)):
        runner = ModelRunner(lm.model, probe.floor, exact_attention=True, batch_exact=probe.batch_exact)
        assert [runner.row_floor(b) for b in (1, 2, 3, 4, 8)] == ([4, 2, 2, 1, 1] if probe.batch_exact else [4] * 5)


def test_batched_requests_on_planted_floors_equal_their_lone_runs() -> None:
    from lookahead.config import GenerationConfig
    from lookahead.scheduler.request import Request
    from lookahead.scheduler.scheduler import Scheduler, SchedulerConfig

    from ..scheduler.helpers import drain

    for total in (True, False):
        lm = _planted16(4, total)
        texts = prompts(5)
        alone = [lookahead.generate(lm, lm.encode(t, raw=True), max_new_tokens=12).token_ids for t in texts]
        scheduler = Scheduler(lm, SchedulerConfig(max_batch=5))
        requests = [Request(lm, lm.encode(t, raw=True), GenerationConfig(max_new_tokens=12)) for t in texts]
        for r in requests:
            scheduler.add(r)
        done = drain(scheduler)
        assert [done[id(r)] for r in requests] == alone, f"total={total}"


def test_probe_says_no_floor_when_rows_are_never_invariant_and_the_engine_runs_unpadded() -> None:
    lm = _planted(None)
    probe = width_probe(lm.model)
    assert probe.floor is None and not probe.gap_invariant
    r = lookahead.generate(lm, lm.encode("abcabcabc", raw=True), max_new_tokens=8)
    assert r.width_floor is None


def test_padded_passes_compute_rows_as_wider_passes_do() -> None:
    # planted floor 5: a 1-row pass padded to 5 rows gives the row what a 12-row pass gives it
    lm = _planted(5)
    ids = torch.tensor(lm.encode("the quick brown fox jumps", raw=True))
    n = ids.numel()

    def row(runner: ModelRunner, width: int) -> torch.Tensor:
        cache = KVCache(KEY_ALIGN)
        runner.prefill(cache, ids[: n - 1].tolist())
        toks = ids[n - 1 :].repeat(width)
        local = torch.eye(width, dtype=torch.bool)
        out = runner.forward(cache, toks, torch.full((width,), n - 1), local, torch.tensor([0]))
        assert cache.get_seq_length() == n - 1 + width  # the dummy rows were dropped again
        return out[0]

    assert install(lm.model)
    padded, plain = ModelRunner(lm.model, floor=5, exact_attention=True), ModelRunner(lm.model, exact_attention=True)
    wide = row(plain, 12)
    torch.testing.assert_close(row(padded, 1), wide, rtol=0, atol=1e-9)  # float64 rounding aside: same row
    assert (row(plain, 1) - wide).abs().max() > 1e-5  # unpadded, the planted 1e-3 shows


def test_keys_are_zero_padded_to_the_alignment_and_the_length_stays_real() -> None:
    cache = KVCache(key_align=8)
    k = torch.ones(1, 2, 5, 4)
    keys, values = cache.update(k, 2 * k, 0)
    assert keys.shape[-2] == 8 and cache.get_seq_length() == 5
    assert torch.equal(keys[..., 5:, :], torch.zeros(1, 2, 3, 4)) and torch.equal(values[..., :5, :], 2 * k)
    cache.keep(3, torch.tensor([0]))  # of the 2 entries after a prefix of 3, keep the first
    keys, _ = cache.update(torch.full((1, 2, 1, 4), 7.0), torch.full((1, 2, 1, 4), 7.0), 0)
    assert cache.get_seq_length() == 5 and keys.shape[-2] == 8
    assert keys[0, 0, 4, 0] == 7.0 and torch.equal(keys[..., 5:, :], torch.zeros(1, 2, 3, 4))  # stale rows zeroed


def test_exact_attention_does_not_depend_on_the_key_buffers_spare_room() -> None:
    # The cache hands out keys and values as views of buffers that grow by doubling, so the same step
    # sees a strided view in one run and a whole buffer in another (lookahead fills its buffer sooner
    # than autoregressive decoding). bf16 matmuls may take other kernels for other layouts; the
    # exact attention must come out the same bits either way.
    from types import SimpleNamespace

    from lookahead.engine.attention import exact_attention, exact_passes

    g = torch.Generator().manual_seed(3)
    module = SimpleNamespace(num_key_value_groups=3, is_causal=False, training=False)
    for keys, spare in ((64, 64), (320, 192), (1088, 960)):
        buf_k = torch.randn(1, 2, keys + spare, 16, generator=g).to(torch.bfloat16)
        buf_v = torch.randn(1, 2, keys + spare, 16, generator=g).to(torch.bfloat16)
        query = torch.randn(1, 6, 5, 16, generator=g).to(torch.bfloat16)
        mask = torch.zeros(1, 1, 5, keys, dtype=torch.bfloat16)
        mask[..., keys - 20 :] = torch.finfo(torch.bfloat16).min
        with exact_passes():
            strided, _ = exact_attention(module, query, buf_k[:, :, :keys], buf_v[:, :, :keys], mask)
            whole, _ = exact_attention(module, query, buf_k[:, :, :keys].clone(), buf_v[:, :, :keys].clone(), mask)
        assert torch.equal(strided, whole), keys


def test_float32_exact_attention_does_not_depend_on_the_key_count() -> None:
    # MKL's float32 matmul reduces a row's keys in an order that depends on how many keys the call has
    # (here: 200 visible keys came out different among 256 or 320 keys than among >= 384), and an
    # autoregressive step and a lookahead step see the same row among different key counts. The exact
    # attention sums values over fixed-size, zero-padded chunks of keys, so the row is the same.
    from types import SimpleNamespace

    from lookahead.engine.attention import exact_attention, exact_passes

    g = torch.Generator().manual_seed(4)
    module = SimpleNamespace(num_key_value_groups=3, is_causal=False, training=False)
    keys, values = torch.randn(1, 3, 2200, 64, generator=g), torch.randn(1, 3, 2200, 64, generator=g)
    for visible in (100, 200, 300, 700, 1000, 1500):
        rows = []
        for total in sorted({-(-visible // 64) * 64, 256, 320, 384, 1024, 1088, 2176} - set(range(visible))):
            for width in (2, 5):  # rows 0 and 1 of passes of two widths
                query = torch.randn(1, 9, 5, 64, generator=torch.Generator().manual_seed(visible))[:, :, :width]
                mask = torch.zeros(1, 1, width, total)
                mask[..., visible:] = float("-inf")
                with exact_passes():
                    out, _ = exact_attention(module, query, keys[:, :, :total], values[:, :, :total], mask)
                rows.append(out[:, :2])
        assert all(torch.equal(r, rows[0]) for r in rows[1:]), visible


def _reference_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                         scale: float) -> torch.Tensor:
    """The exact attention's arithmetic spelled out op by op (as written before one op replaced three):
    scores in the model dtype, then in float32 (float64 stays), times the scale, plus the mask; softmax
    in float32; probabilities back in the model dtype; one matmul per 1024 keys, summed in float32.
    Returns [B, Q, H, D]."""
    b, h, q, d = query.shape
    kv = key.shape[1]
    acc = torch.promote_types(query.dtype, torch.float32)
    scores = torch.matmul(query.reshape(b, kv, h // kv * q, d), key.contiguous().transpose(-1, -2)).to(acc) * scale
    scores = scores.view(b, kv, h // kv, q, -1) + mask.to(acc)[:, :, None]
    probs = torch.softmax(scores, dim=-1).to(value.dtype).view(b, kv, h // kv * q, -1)
    from lookahead.engine.value_sums import weighted_sum

    return weighted_sum(probs, value).view(b, h, q, d).transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("head", [64, 96, 256])  # scales 1/8 and 1/16 (powers of two: the fused op), 96**-0.5
def test_exact_attention_is_its_op_by_op_reference_bit_for_bit(dtype: torch.dtype, head: int,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # The engine's exactness rests on these bits (the width probe measured them): computing the scaled,
    # masked scores in one op where the scale is a power of two, and taking the mask already in float32
    # (the model runner converts it once a pass), must not change a single one. Masks arrive in the
    # model dtype from other callers, so both are checked. This is the matmul path: bfloat16 passes run
    # on the C++ kernel where it builds (tests/engine/test_exact_kernel.py), so it is switched off here.
    from types import SimpleNamespace

    from lookahead.engine import exact_kernel
    from lookahead.engine.attention import exact_attention, exact_passes

    monkeypatch.setattr(exact_kernel, "serves", lambda dtype, head_dim: False)

    g = torch.Generator().manual_seed(head)
    module = SimpleNamespace(num_key_value_groups=3, is_causal=False, training=False)
    for keys, rows in ((64, 1), (320, 5), (1088, 3)):
        query = torch.randn(1, 6, rows, head, generator=g).mul(3).to(dtype)
        key, value = (torch.randn(1, 2, keys, head, generator=g).mul(3).to(dtype) for _ in range(2))
        mask = torch.zeros(1, 1, rows, keys, dtype=dtype)
        mask[..., keys - 40 :] = torch.finfo(dtype).min
        mask[..., 0, keys - 60 :] = torch.finfo(dtype).min  # rows see different keys
        want = _reference_attention(query, key, value, mask, head**-0.5)
        for m in (mask, mask.to(torch.promote_types(dtype, torch.float32))):
            with exact_passes():
                got, _ = exact_attention(module, query, key, value, m, scaling=head**-0.5)
            assert torch.equal(got, want), (keys, rows, m.dtype)


@pytest.mark.parametrize("arch", ARCHS)
def test_exact_attention_equals_sdpa_in_float64(arch: str) -> None:
    lm = model64(arch)
    width_probe(lm.model)  # installs the exact attention
    ids = torch.tensor(lm.encode("lorem ipsum dolor sit amet", raw=True))
    n = ids.numel()
    causal = torch.ones(n, n, dtype=torch.bool).tril_()
    exact = ModelRunner(lm.model, exact_attention=True).forward(KVCache(KEY_ALIGN), ids, torch.arange(n), causal,
                                                                torch.arange(n))
    with torch.no_grad():  # outside the engine's passes the model runs transformers' SDPA as before
        ref = lm.model(ids[None]).logits[0]
    torch.testing.assert_close(exact, ref, rtol=1e-10, atol=1e-10)


def test_a_model_whose_context_is_too_short_to_probe_gets_a_clear_error() -> None:
    lm = tiny_model("llama", dtype=torch.float64, max_position_embeddings=24)
    assert width_probe(lm.model).max_width <= 24  # narrow steps can still be probed
    with pytest.raises(ConfigError, match="too short to probe"):
        lookahead.generate(lm, lm.encode("ab", raw=True), max_new_tokens=2)
    # unpadded decoding needs no probe
    assert len(lookahead.generate(lm, lm.encode("ab", raw=True), max_new_tokens=2, exact=False).token_ids) == 2


@pytest.mark.parametrize("kernel", ["kernel", "matmuls"])
def test_default_trees_are_whole_and_off_means_first_chains_only(kernel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Defaults: key_views=False, aligned_trees=True. Where the probe found whole trees exact, default
    # steps verify branches (gap-free on the C++ kernel, at aligned offsets on the matmul path) and never
    # over key views; aligned_trees=False verifies each tree's first chain only: no branch at all. The
    # tokens are the same throughout.
    from lookahead.scheduler.scheduler import SchedulerConfig

    if kernel == "matmuls":
        kernel_off(monkeypatch)
    lm = model16("llama")
    probe = width_probe(lm.model)  # probed before the spies: the probe itself runs views and placements
    assert probe.tree_exact and probe.aligned_exact
    views, placed, branches = spy_key_views(monkeypatch), spy_aligned_branches(monkeypatch), spy_branches(monkeypatch)
    for text in prompts(4):
        ids = lm.encode(text, raw=True)
        ar = lookahead.generate(lm, ids, max_new_tokens=24, strategy="autoregressive")
        trees = lookahead.generate(lm, ids, max_new_tokens=24, adaptive=False)
        assert trees.token_ids == ar.token_ids
    assert not views and branches and ("gap" in placed) == (kernel == "matmuls")
    branches.clear()
    placed.clear()
    for text in prompts(4):
        ids = lm.encode(text, raw=True)
        ar = lookahead.generate(lm, ids, max_new_tokens=24, strategy="autoregressive")
        chain = lookahead.generate(lm, ids, max_new_tokens=24, adaptive=False, aligned_trees=False)
        assert chain.token_ids == ar.token_ids
    assert not views and not branches and "gap" not in placed
    with pytest.raises(ConfigError, match="key_views"):
        SchedulerConfig(key_views="no")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="aligned_trees"):
        SchedulerConfig(aligned_trees="no")  # type: ignore[arg-type]


def test_prefill_runs_the_fused_kernel_and_decoding_steps_the_exact_one(monkeypatch: pytest.MonkeyPatch) -> None:
    # The prompt's keys come from one fused (SDPA) pass, the same for every way of decoding it; only the
    # steps, whose logits are read, run the exact attention. (Exact prefill cost 2.6x at 1,500 tokens.)
    from lookahead.engine import model_runner
    from lookahead.engine.sampling import TokenChooser
    from lookahead.engine.step import StepRunner
    from lookahead.config import GREEDY
    from lookahead.engine.draft import CandidateTree, Draft

    lm = model16("llama")
    exact_calls: list[int] = []
    enter = model_runner.exact_passes
    monkeypatch.setattr(model_runner, "exact_passes", lambda *a: (exact_calls.append(1), enter(*a))[1])
    runner = StepRunner(lm.model, TokenChooser(GREEDY, lm.model.config.vocab_size), width_probe(lm.model))
    assert runner.model.exact_attention and runner.model.floor is not None
    exact_calls.clear()  # the probe's own passes
    prompt = lm.encode("the quick brown fox jumps over the lazy dog", raw=True)
    cache = runner.new_cache()
    runner.prefill(cache, prompt)
    assert cache.get_seq_length() == len(prompt) - 1 and not exact_calls  # the prompt: fused kernel
    plain = ModelRunner(lm.model)  # no exact attention anywhere: the same prompt keys, bit for bit
    reference = KVCache(KEY_ALIGN)
    plain.prefill(reference, prompt[:-1])
    for mine, ref in zip(cache.layers, reference.layers):
        assert torch.equal(mine.keys, ref.keys) and torch.equal(mine.values, ref.values)
    runner.step(cache, prompt[-1], Draft(CandidateTree()))
    assert exact_calls == [1]  # the step's logits: exact attention


def test_a_fused_pass_refuses_key_views() -> None:
    # key views are recomputed inside the exact attention: a pass on the fused kernel cannot honour them
    from lookahead.engine.model_runner import Rows

    lm = model16("llama")
    assert install(lm.model)
    runner = ModelRunner(lm.model, exact_attention=True, views=True)
    cache = KVCache(KEY_ALIGN)
    runner.prefill(cache, lm.encode("some context", raw=True))
    rows = Rows(torch.tensor([5, 6]), torch.tensor([11, 11]), torch.eye(2, dtype=torch.bool), torch.arange(2),
                views=(([1], [1]),))
    with pytest.raises(ValueError, match="fused kernel"):
        runner.forward_batch(cache, [rows], fused=True)
