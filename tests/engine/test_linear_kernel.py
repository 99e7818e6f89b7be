"""lookahead's bfloat16 linear kernel (engine/linear_kernel.cpp) and the models that run on it (models/packing.py).

It is compiled where the compiler targets AVX-512 BF16 (every machine CI and the benchmarks ran on). Where it
is not, the tests of the fallback below still run: the layers pack for oneDNN, and the kernel refuses."""

from __future__ import annotations

import copy

import pytest
import torch

from lookahead.engine import exact_kernel
from lookahead.engine.numerics import width_probe
from lookahead.models import packing
from lookahead.models.packing import TiledWeight, pack_linears, packed_count
from lookahead.testing import ARCHS, tiny_model
from tests.test_packing import assert_lookahead_equals_autoregressive


def _supported() -> bool:
    module = exact_kernel.kernel()
    assert module is not None, f"the engine's C++ extension did not build here: {exact_kernel.status()}"
    return bool(module.linear_supported())


def _tiled(model: torch.nn.Module) -> int:
    """Layers (and stacks of sibling layers) whose weights are tiled."""
    stacks = {id(m.stacked): m.stacked for m in model.modules() if isinstance(m, packing.PackedProjection)}
    layers = [m for m in model.modules() if isinstance(m, packing.PackedLinear)]
    return sum(isinstance(x.packed, TiledWeight) for x in [*layers, *stacks.values()])


def _weights(out: int, inp: int, seed: int, bias: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(out, inp, generator=gen) / inp**0.5).bfloat16()
    return w, (torch.randn(out, generator=gen).bfloat16() if bias else None)


def _linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return exact_kernel.kernel().tiled_linear(x, exact_kernel.kernel().tile_weight(w), b)


@pytest.mark.parametrize(("out", "inp", "bias"), [(16, 2, False), (48, 64, True), (576, 576, False),
                                                  (192, 576, True), (576, 1536, False)])
def test_each_output_is_the_exact_product_rounded_once(out: int, inp: int, bias: bool) -> None:
    # products of bfloat16 values are exact in float32 and the sums run in float32, so every output is
    # the float64 result rounded to bfloat16, give or take the float32 sums' rounding: within one
    # bfloat16 ulp of it (half an ulp from the final rounding, the rest far below), never further
    if not _supported():
        return
    w, b = _weights(out, inp, seed=out + inp, bias=bias)
    x = torch.randn(37, inp, generator=torch.Generator().manual_seed(1)).bfloat16()
    y = _linear(x, w, b).double()
    ref = x.double() @ w.double().T + (0 if b is None else b.double())
    ulp = torch.exp2(torch.floor(torch.log2(ref.abs().clamp_min(1e-30))) - 7)  # bfloat16: 8 significant bits
    sums = 2.0**-20 * (x.double().abs() @ w.double().abs().T)  # what float32 sums may have rounded away
    assert ((y - ref).abs() <= ulp + sums).all()


def test_a_rows_bits_do_not_depend_on_the_rows_beside_it() -> None:
    # the property exact passes need: every count of rows (each register tile and its remainders: 1-3
    # rows take 8 column blocks at once, 4-6 four, 7-8 three, more two in tiles of 12) gives each row the
    # bits it gets alone; so do 1-D, 3-D and non-contiguous inputs
    if not _supported():
        return
    w, b = _weights(16 * 19, 96, seed=2, bias=True)  # 19 column blocks: no tile width divides them
    tiled = exact_kernel.kernel().tile_weight(w)
    x = torch.randn(70, 96, generator=torch.Generator().manual_seed(3)).bfloat16()
    alone = torch.cat([exact_kernel.kernel().tiled_linear(x[i], tiled, b)[None] for i in range(70)])
    for n in (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 24, 25, 70):
        assert torch.equal(exact_kernel.kernel().tiled_linear(x[:n], tiled, b), alone[:n]), n
    assert torch.equal(exact_kernel.kernel().tiled_linear(x.view(7, 10, 96), tiled, b), alone.view(7, 10, -1))
    assert torch.equal(exact_kernel.kernel().tiled_linear(x.T.contiguous().T, tiled, b), alone)
    assert exact_kernel.kernel().tiled_linear(x[:0], tiled, b).shape == (0, 16 * 19)


def test_the_kernel_says_what_it_takes() -> None:
    kernel = exact_kernel.kernel()
    assert kernel is not None, exact_kernel.status()
    with pytest.raises(RuntimeError, match="multiple of 16"):
        kernel.tile_weight(torch.zeros(24, 8, dtype=torch.bfloat16))
    if not _supported():
        with pytest.raises(RuntimeError, match="without AVX-512 BF16"):
            kernel.tiled_linear(torch.zeros(1, 8, dtype=torch.bfloat16), kernel.tile_weight(torch.zeros(16, 8)), None)
        return
    tiled = kernel.tile_weight(torch.zeros(16, 8, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="has 6 inputs, the weight 8"):
        kernel.tiled_linear(torch.zeros(1, 6, dtype=torch.bfloat16), tiled, None)
    with pytest.raises(RuntimeError, match="bfloat16 x"):
        kernel.tiled_linear(torch.zeros(1, 8), tiled, None)


@pytest.mark.parametrize("arch", ARCHS)
def test_lookahead_on_a_tiled_model_equals_its_autoregressive_decoding(arch: str) -> None:
    # bfloat16 layers run tiled wherever their shapes allow (whole 16-column blocks): other last bits than
    # oneDNN's, the same for every strategy, so lookahead (greedy and seeded sampling, trees and the
    # Jacobi window) equals the tiled model's own autoregressive decoding token for token
    lm = tiny_model(arch, dtype=torch.bfloat16, seed=3)
    linears = [m for m in lm.model.modules() if type(m) is torch.nn.Linear]
    tileable = sum(m.out_features % 16 == 0 and m.in_features % 2 == 0 for m in linears)  # gpt2: none (Conv1D)
    assert pack_linears(lm.model) == len(linears) == packed_count(lm.model)
    assert (_tiled(lm.model) > 0) == (_supported() and tileable > 0)
    assert width_probe(lm.model).floor == 1  # every row count computes a row alike: no dummy rows
    assert_lookahead_equals_autoregressive(lm, arch)


def test_a_tiled_kernel_whose_rows_depend_on_the_count_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    # the rule that lets tiled layers change bits is that they make every row count compute a row alike:
    # a planted dependence on the row count, and no layer runs tiled (those oneDNN takes still pack)
    lm = tiny_model("llama", dtype=torch.bfloat16, seed=1)
    linears = [m for m in lm.model.modules() if type(m) is torch.nn.Linear]
    untileable = sum(m.out_features % 16 != 0 or m.in_features % 2 != 0 for m in linears)  # the LM head here
    real = packing._packed_matmul
    monkeypatch.setattr(packing, "_packed_matmul", lambda x, w, b: real(x, w, b) + (
        1e-2 * (x.numel() // x.shape[-1]) if isinstance(w, TiledWeight) else 0))
    pack_linears(lm.model)
    assert _tiled(lm.model) == 0
    assert packed_count(lm.model) == (untileable if _supported() else len(linears))


def test_a_tiled_model_deep_copies_with_its_own_tiles() -> None:
    lm = tiny_model("qwen2", dtype=torch.bfloat16, seed=1)  # biases, tiled too
    pack_linears(lm.model)
    twin = copy.deepcopy(lm.model)
    assert _tiled(twin) == _tiled(lm.model) and packed_count(twin) == packed_count(lm.model)
    ids = torch.tensor(lm.encode("two copies", raw=True))
    with torch.no_grad():
        assert torch.equal(twin(input_ids=ids[None]).logits, lm.model(input_ids=ids[None]).logits)


def test_linear_kernel_off_packs_for_onednn_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    # LOOKAHEAD_LINEAR_KERNEL=0: no tiled layer, and the device signature (which keys cached probes and
    # timings) tells the two apart
    on = exact_kernel.status()
    monkeypatch.setenv(exact_kernel.LINEAR_ENV, "0")
    lm = tiny_model("llama", dtype=torch.bfloat16, seed=1)
    assert pack_linears(lm.model) > 0 and _tiled(lm.model) == 0
    assert exact_kernel.status() == "on, linears off (LOOKAHEAD_LINEAR_KERNEL=0)" != on
