"""Packed linear weights (models/packing.py): faster, and never at the cost of exactness."""

from __future__ import annotations

import copy

import pytest
import torch

import lookahead
from lookahead import LookaheadConfig, SamplingConfig
from lookahead.engine.exact_kernel import LINEAR_ENV
from lookahead.engine.numerics import width_probe
from lookahead.models import packing
from lookahead.models.packing import PackedLinear, pack_linears, packed_count, unpack_linears
from lookahead.testing import ARCHS, tiny_model


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids[None]).logits[0]


@pytest.fixture
def onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    """bfloat16 packs for oneDNN, not lookahead's tiled kernel (tested in tests/engine/test_linear_kernel.py):
    the rules below are about oneDNN's packed weights against PyTorch's plain kernel."""
    monkeypatch.setenv(LINEAR_ENV, "0")


@pytest.mark.parametrize("arch", ARCHS)
def test_packed_bf16_model_computes_the_same_bits(arch: str, onednn: None) -> None:
    lm = tiny_model(arch, dtype=torch.bfloat16, seed=1)
    plain = copy.deepcopy(lm.model)
    linears = sum(type(m) is torch.nn.Linear for m in lm.model.modules())
    assert pack_linears(lm.model) == linears == packed_count(lm.model) > 0  # every bf16 layer packs here
    ids = torch.tensor(lm.encode("the quick brown fox jumps over the lazy dog", raw=True))
    for n in (1, 2, 5, ids.numel()):  # one row, a few, the whole prompt
        assert torch.equal(_logits(lm.model, ids[:n]), _logits(plain, ids[:n])), f"{arch}: {n} rows"


def test_a_kernel_that_changes_bits_is_not_used(monkeypatch: pytest.MonkeyPatch, onednn: None) -> None:
    # a packed kernel off by one ulp-ish nudge anywhere: no layer may be swapped
    lm = tiny_model("llama", dtype=torch.bfloat16, seed=1)
    real = packing._packed_matmul
    monkeypatch.setattr(packing, "_packed_matmul", lambda x, w, b: real(x, w, b) * 1.01)
    assert pack_linears(lm.model) == 0 and packed_count(lm.model) == 0


def _width_dependent(kernel):  # type: ignore[no-untyped-def]
    """`kernel` with a planted dependence on the row count, as a matmul choosing its blocking by M."""
    return lambda x, w, b: kernel(x, w, b) + 1e-3 * x.shape[0]


def test_a_packed_kernel_that_makes_rows_width_invariant_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    # the plain kernel's rows change with the row count (float32 MKL here); the packed one, other bits
    # but the same rows at every count, makes passes exact: every layer packs
    lm = tiny_model("llama", dtype=torch.float32, seed=1)
    monkeypatch.setattr(packing, "_plain_matmul", _width_dependent(packing._plain_matmul))
    real = packing._packed_matmul
    monkeypatch.setattr(packing, "_packed_matmul", lambda x, w, b: real(x, w, b) * 1.01)
    linears = sum(type(m) is torch.nn.Linear for m in lm.model.modules())
    assert pack_linears(lm.model) == linears > 0


def test_a_packed_kernel_whose_rows_depend_on_the_count_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    # both kernels width-dependent and differing: packing would buy speed with other bits and no
    # exactness in return
    lm = tiny_model("llama", dtype=torch.float32, seed=1)
    monkeypatch.setattr(packing, "_plain_matmul", _width_dependent(packing._plain_matmul))
    real = packing._packed_matmul
    rows = lambda x: x.numel() // x.shape[-1]  # noqa: E731 (the kernel takes [..., in])
    monkeypatch.setattr(packing, "_packed_matmul", lambda x, w, b: real(x, w, b) * 1.01 + 2e-3 * rows(x))
    assert pack_linears(lm.model) == 0


def test_one_row_is_computed_as_the_first_of_two(monkeypatch: pytest.MonkeyPatch, onednn: None) -> None:
    # oneDNN takes another path for a single row (SmolLM2's down_proj in bfloat16 gave other bits on 17
    # of 200 rows): planted here as a one-row kernel that is off. The layer still packs, and its single
    # row is the bits of the same row in any wider call, so the model needs no dummy row (floor 1)
    lm = tiny_model("llama", dtype=torch.bfloat16, seed=1)
    real = packing._packed_matmul
    one_row = lambda x: x.numel() == x.shape[-1]  # noqa: E731 (the kernel takes [..., in])
    monkeypatch.setattr(packing, "_packed_matmul", lambda x, w, b: real(x, w, b) * (1.01 if one_row(x) else 1.0))
    linears = sum(type(m) is torch.nn.Linear for m in lm.model.modules())
    assert pack_linears(lm.model) == linears > 0
    layer = next(m for m in lm.model.modules() if isinstance(m, PackedLinear))
    x = torch.randn(5, layer.in_features, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    with torch.no_grad():
        wide = layer(x)
        for i in range(5):
            assert torch.equal(layer(x[i : i + 1]), wide[i : i + 1])
            assert torch.equal(layer(x[i]), wide[i])  # a 1-D input is one row too
            assert torch.equal(layer(x[None, i : i + 1]), wide[None, i : i + 1])  # so is [1, 1, in]
        assert torch.equal(layer(x[None]), wide[None])  # [1, 5, in], as the model calls it


def assert_lookahead_equals_autoregressive(lm: lookahead.LoadedModel, label: str) -> None:
    """Three prompts (one repetitive, one seeded top-p sampling): lookahead, adaptive trees and the Jacobi
    window as proposed, gives autoregressive decoding's token ids."""
    for i, text in enumerate(["the quick brown fox", "one two three one two three one two", "abcabcabcabc"]):
        ids = lm.encode(text, raw=True)
        sampling = SamplingConfig(temperature=0.9, top_p=0.95, seed=i) if i == 2 else None
        ar = lookahead.generate(lm, ids, max_new_tokens=24, strategy="autoregressive", sampling=sampling)
        la = lookahead.generate(lm, ids, max_new_tokens=24, lookahead=LookaheadConfig(2, 4, 4), sampling=sampling,
                                adaptive=i != 1)
        assert la.token_ids == ar.token_ids, (label, text)


@pytest.mark.parametrize("arch", ARCHS)
def test_lookahead_on_a_packed_float32_model_equals_its_autoregressive_decoding(arch: str) -> None:
    # float32 packs where that makes rows width-invariant (its bits then differ from the plain kernel's):
    # the engine's guarantee is against the model as it runs, packed
    lm = tiny_model(arch, dtype=torch.float32, seed=3)
    pack_linears(lm.model)
    assert width_probe(lm.model).floor is not None
    assert_lookahead_equals_autoregressive(lm, arch)


def test_packed_layers_fall_back_where_the_packed_copy_does_not_fit() -> None:
    lm = tiny_model("llama", dtype=torch.bfloat16, seed=1)
    pack_linears(lm.model)
    layer = next(m for m in lm.model.modules() if isinstance(m, PackedLinear))
    x = torch.randn(3, layer.in_features)
    # gradients: the plain linear (the packed op has no backward)
    y = layer(x.to(torch.bfloat16).requires_grad_())
    y.float().sum().backward()
    assert layer.weight.grad is not None
    # converted to float32 afterwards: the stale bf16 copy is not used, and .to() left it alone
    lm.model.to(torch.float32)
    with torch.no_grad():
        assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))
    assert layer.packed.dtype == torch.bfloat16


def test_lookahead_on_a_packed_model_equals_autoregressive_on_the_plain_one(onednn: None) -> None:
    # the engine's guarantee across the swap: packing changes speed, so the tokens are the plain model's
    plain = tiny_model("llama", dtype=torch.bfloat16, seed=1)
    packed = tiny_model("llama", dtype=torch.bfloat16, seed=1)
    assert pack_linears(packed.model) > 0
    for i, text in enumerate(["the quick brown fox", "one two three one two three one two", "abcabcabcabc"]):
        ids = plain.encode(text, raw=True)
        sampling = SamplingConfig(temperature=0.9, top_p=0.95, seed=i) if i == 2 else None
        ar = lookahead.generate(plain, ids, max_new_tokens=24, strategy="autoregressive", sampling=sampling)
        la = lookahead.generate(packed, ids, max_new_tokens=24, lookahead=LookaheadConfig(2, 4, 4), sampling=sampling)
        assert la.token_ids == ar.token_ids, text


def test_timings_are_kept_apart_for_packed_models() -> None:
    lm = lookahead.load("tiny:llama", dtype="bfloat16", probe=False, pack=False)
    assert lm.packed == 0 and "|packed" not in lm.timing_key
    lm = lookahead.load("tiny:llama", dtype="bfloat16", probe=False)
    assert lm.packed > 0 and lm.timing_key.endswith(f"|packed{packing.PACKING_VERSION}")  # new packing, new timings


def test_auto_dtype_times_each_dtype_as_load_runs_it(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # noqa: ANN001
    # "auto" compares both dtypes as load() will run them, packed (float32 too, here: packing makes its rows
    # width-invariant), and leaves the model untouched
    from lookahead.models import dtypes

    monkeypatch.setenv("LOOKAHEAD_CACHE", str(tmp_path))
    monkeypatch.setattr(dtypes, "supported", lambda device="cpu": ("float32", "bfloat16"))
    timed: list[tuple[torch.dtype, int]] = []

    def fake_step_time(model: torch.nn.Module) -> float:
        dtype = next(model.parameters()).dtype
        timed.append((dtype, packed_count(model)))
        return 1.0 if dtype == torch.float32 else 0.5

    monkeypatch.setattr(dtypes, "_step_time", fake_step_time)
    lm = tiny_model("llama", dtype=torch.float32, seed=1)
    assert dtypes.choose(lm.model, "tiny-test") == torch.bfloat16
    assert timed[0] == (torch.float32, pack_linears(copy.deepcopy(lm.model)))  # what load() packs in float32
    assert timed[1][0] == torch.bfloat16 and timed[1][1] > 0
    assert packed_count(lm.model) == 0 and next(lm.model.parameters()).dtype == torch.float32
    timed.clear()
    assert dtypes.choose(lm.model, "tiny-test", pack=False) == torch.bfloat16 and timed[1] == (torch.bfloat16, 0)
    # cached per packing: the second call times nothing
    assert dtypes.choose(lm.model, "tiny-test") == torch.bfloat16 and len(timed) == 2 * dtypes.TIMING_ROUNDS


def test_a_packed_model_deep_copies_and_unpacks(onednn: None) -> None:
    # copies of a loaded model (the certificate's reference, dtype timing) must work on packed layers,
    # whose blocked weights have no storage to copy; a tied LM head stays tied in the copy
    lm = tiny_model("gemma3", dtype=torch.bfloat16, seed=1)
    n = pack_linears(lm.model)
    ids = torch.tensor(lm.encode("copy me twice", raw=True))
    twin = copy.deepcopy(lm.model)
    assert packed_count(twin) == n and torch.equal(_logits(twin, ids), _logits(lm.model, ids))
    head, embed = twin.get_output_embeddings().weight, twin.get_input_embeddings().weight
    assert (head is embed) == (lm.model.get_output_embeddings().weight is lm.model.get_input_embeddings().weight)
    assert unpack_linears(twin) == n and packed_count(twin) == 0
    assert torch.equal(_logits(twin, ids), _logits(lm.model, ids))  # bf16: packing changed no bit


def test_a_model_converted_after_packing_deep_copies_as_plain_layers() -> None:
    # the packed copies are stale after .to(float64): a copy gets plain layers, not a re-pack oneDNN refuses
    lm = tiny_model("llama", dtype=torch.bfloat16, seed=1)
    assert pack_linears(lm.model) > 0
    lm.model.to(torch.float64)
    twin = copy.deepcopy(lm.model)
    assert packed_count(twin) == 0
    ids = torch.tensor(lm.encode("stale copies", raw=True))
    assert torch.equal(_logits(twin, ids), _logits(lm.model, ids))


def test_auto_dtype_is_not_flipped_by_one_slow_timing(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # noqa: ANN001
    # the machine busy during bfloat16's first timing (2.0 against float32's 1.0): the alternate round
    # times it at 0.5, and the verdict is bfloat16
    from lookahead.models import dtypes

    monkeypatch.setenv("LOOKAHEAD_CACHE", str(tmp_path))
    monkeypatch.setattr(dtypes, "supported", lambda device="cpu": ("float32", "bfloat16"))
    monkeypatch.setattr(dtypes, "TIMING_ROUNDS", 2)
    bf16_times = iter([2.0, 0.5])
    monkeypatch.setattr(dtypes, "_step_time", lambda model: next(bf16_times)
                        if next(model.parameters()).dtype == torch.bfloat16 else 1.0)
    assert dtypes.choose(tiny_model("llama", dtype=torch.float32, seed=1).model, "tiny-slow") == torch.bfloat16


def test_auto_dtype_loads_the_model_the_named_dtype_loads(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # noqa: ANN001
    # "auto" resolving to bfloat16 must give the model dtype="bfloat16" gives: casting the float32 model
    # instead rounded the rotary inv_freq buffer to bfloat16 (transformers keeps it float32), which moved
    # every position's angle and changed SmolLM2's greedy text
    from lookahead.models import dtypes

    lm = tiny_model("llama", dtype=torch.float32, seed=1)
    folder = tmp_path / "model"
    lm.model.save_pretrained(folder)
    lm.tokenizer.save_pretrained(folder)
    monkeypatch.setattr(dtypes, "choose", lambda model, key, device="cpu", pack=True: torch.bfloat16)
    auto = lookahead.load(str(folder), probe=False, pack=False)
    named = lookahead.load(str(folder), dtype="bfloat16", probe=False, pack=False)
    assert auto.dtype == named.dtype == torch.bfloat16
    buffers = dict(named.model.named_buffers())
    assert any(b.dtype == torch.float32 for b in buffers.values())  # the case that matters is here
    for name, tensor in [*auto.model.named_parameters(), *auto.model.named_buffers()]:
        theirs = buffers.get(name, dict(named.model.named_parameters()).get(name))
        assert theirs is not None and tensor.dtype == theirs.dtype and torch.equal(tensor, theirs), name


def _projections(model: torch.nn.Module) -> list[packing.PackedProjection]:
    return [m for m in model.modules() if isinstance(m, packing.PackedProjection)]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])  # qwen2: biases stacked too
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_sibling_projections_run_as_one_matmul_with_each_layers_own_bits(
        arch: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    lm = tiny_model(arch, dtype=dtype, seed=1)
    alone = copy.deepcopy(lm.model)
    monkeypatch.setattr(packing, "_stack_siblings", lambda model: None)  # packed, every layer on its own
    pack_linears(alone)
    monkeypatch.undo()
    assert pack_linears(lm.model) == packed_count(alone) == packed_count(lm.model)
    # every decoder layer: q, k, v in one stack, gate and up in another
    layers = lm.model.config.num_hidden_layers
    assert len(_projections(lm.model)) == 5 * layers and not _projections(alone)
    assert len({id(p.stacked) for p in _projections(lm.model)}) == 2 * layers
    ids = torch.tensor(lm.encode("the quick brown fox jumps over the lazy dog", raw=True))
    for n in (1, 2, 5, ids.numel()):
        assert torch.equal(_logits(lm.model, ids[:n]), _logits(alone, ids[:n])), f"{arch} {dtype}: {n} rows"
    # no stack holds on to a pass's input or products once every member has taken its output
    assert all(p.stacked._last is None for p in _projections(lm.model))


def test_a_member_called_out_of_turn_still_gets_its_own_output() -> None:
    # the stack serves a member from the last input only when it is the same tensor: another input (or a
    # member asked twice) is computed afresh, so the call order of the model's code never changes a result
    lm = tiny_model("llama", dtype=torch.bfloat16, seed=1)
    attention = lm.model.model.layers[0].self_attn
    plain = {n: copy.deepcopy(getattr(attention, n)) for n in ("q_proj", "k_proj", "v_proj")}
    pack_linears(lm.model)
    assert isinstance(attention.q_proj, packing.PackedProjection)
    gen = torch.Generator().manual_seed(3)
    a, b = (torch.randn(1, 3, attention.q_proj.in_features, generator=gen).to(torch.bfloat16) for _ in range(2))

    def own(name: str, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return plain[name](x)

    with torch.no_grad():
        calls = [("k_proj", a), ("q_proj", b), ("q_proj", b), ("v_proj", a), ("k_proj", b), ("v_proj", b), ("q_proj", a)]
        for name, x in calls:
            assert torch.equal(getattr(attention, name)(x), own(name, x)), name


def test_a_stacks_members_in_one_call_get_their_own_outputs() -> None:
    # group_runner: q, k and v (in that order) are one stack, so one call hands each its own output;
    # members of two stacks, a stack's members out of order or one short, or a plain layer: no runner
    lm = tiny_model("llama", dtype=torch.bfloat16, seed=1)
    attention, mlp = lm.model.model.layers[0].self_attn, lm.model.model.layers[0].mlp
    plain = {n: copy.deepcopy(getattr(attention, n)) for n in ("q_proj", "k_proj", "v_proj")}
    pack_linears(lm.model)
    q, k, v = attention.q_proj, attention.k_proj, attention.v_proj
    run = packing.group_runner([q, k, v])
    assert run is not None
    assert packing.group_runner([k, q, v]) is None and packing.group_runner([q, k]) is None
    assert packing.group_runner([q, k, mlp.up_proj]) is None and packing.group_runner([attention.o_proj]) is None
    assert packing.group_runner([]) is None
    x = torch.randn(2, 3, q.in_features, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    with torch.no_grad():
        outs = run(x)
        assert [o.shape[-1] for o in outs] == [q.out_features, k.out_features, v.out_features]
        for name, out in zip(("q_proj", "k_proj", "v_proj"), outs):
            assert torch.equal(out, plain[name](x)), name
    assert q.stacked._last is None  # the runner holds nothing between calls
    # where gradients are wanted the stack cannot serve (its kernel records none): each member's own
    # forward (the plain linear) runs, as it would alone
    outs = run(x)
    assert all(o.requires_grad for o in outs)
    for name, out in zip(("q_proj", "k_proj", "v_proj"), outs):
        assert torch.equal(out, getattr(attention, name)(x)), name


def test_a_stack_that_changes_bits_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    # stacked products a nudge off their members' own: the layers stay packed one by one
    lm = tiny_model("llama", dtype=torch.bfloat16, seed=1)
    real = packing._Stacked.run
    monkeypatch.setattr(packing._Stacked, "run", lambda self, x: [p * 1.01 for p in real(self, x)])
    linears = sum(type(m) is torch.nn.Linear for m in lm.model.modules())
    assert pack_linears(lm.model) == linears == packed_count(lm.model) and not _projections(lm.model)


def test_a_copied_model_stacks_its_own_weights() -> None:
    # the copy's members share one stack of the copy's weights, not the original's
    lm = tiny_model("qwen2", dtype=torch.bfloat16, seed=1)
    pack_linears(lm.model)
    twin = copy.deepcopy(lm.model)
    mine, theirs = _projections(lm.model), _projections(twin)
    assert len(theirs) == len(mine) and not {id(p.stacked) for p in mine} & {id(p.stacked) for p in theirs}
    attention = twin.model.layers[0].self_attn
    assert attention.q_proj.stacked is attention.k_proj.stacked is attention.v_proj.stacked
    assert attention.k_proj.stacked.weights[1] is attention.k_proj.weight  # the copy's own parameter
    assert attention.k_proj.weight is not lm.model.model.layers[0].self_attn.k_proj.weight
    ids = torch.tensor(lm.encode("two copies", raw=True))
    assert torch.equal(_logits(twin, ids), _logits(lm.model, ids))


def test_a_stacked_member_is_handed_on_as_a_view_only_at_whole_vector_widths() -> None:
    # widths that are multiples of VIEW_WIDTH leave no scalar remainder in PyTorch's vectorized loops: a
    # view into the stacked product; any other width gets its own contiguous copy
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, 32, generator=gen).to(torch.bfloat16) for n in (64, 40, 128)]
    stacked = packing._Stacked(weights, [None, None, None])
    x = torch.randn(3, 32, generator=gen).to(torch.bfloat16)
    q, k, g = stacked.run(x)
    assert not q.is_contiguous() and not g.is_contiguous() and k.is_contiguous()
    assert q.untyped_storage().data_ptr() == g.untyped_storage().data_ptr() != k.untyped_storage().data_ptr()
    for part, w in zip((q, k, g), weights):
        assert torch.equal(part, torch.nn.functional.linear(x, w))
