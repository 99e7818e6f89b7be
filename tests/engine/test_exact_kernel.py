"""The exact attention's C++ kernel (engine/exact_kernel.cpp, loaded by engine/exact_kernel.py).

CI builds it (the machine has a C++ compiler, and ninja comes with the package): these tests fail, never
skip, where it does not build. bfloat16 equivalence of whole models through it is tests/engine/test_numerics.py
and test_key_views.py (exact bfloat16 passes run on the kernel)."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from lookahead.engine import attention, exact_kernel
from lookahead.engine.attention import exact_attention, exact_passes


@pytest.fixture(scope="module")
def kern():
    module = exact_kernel.kernel()
    assert module is not None, f"the exact-attention kernel did not build here: {exact_kernel.status()}"
    return module


def _reference(query, key, value, mask, scale):
    """float64 attention with grouped heads: [B, H, Q, D]."""
    q, k, v = query.double(), key.double(), value.double()
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = q @ k.transpose(-1, -2) * scale + mask.double()[:, None]
    return torch.softmax(scores, -1) @ v


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("head_dim", [16, 64, 256])
def test_scores_and_sums_are_attention(kern, dtype: torch.dtype, head_dim: int) -> None:
    # 2 sequences, 6 query heads over 2 kv heads (grouped), 5 rows, 48 keys of which the last 7 are masked:
    # the kernel's two products around torch's softmax give attention, to float32 rounding of the inputs.
    gen = torch.Generator().manual_seed(head_dim)
    query = torch.randn(2, 6, 5, head_dim, generator=gen).to(dtype)
    key = torch.randn(2, 2, 48, head_dim, generator=gen).to(dtype)
    value = torch.randn(2, 2, 48, head_dim, generator=gen).to(dtype)
    mask = torch.zeros(2, 5, 48)
    mask[..., 41:] = float("-inf")
    scale = head_dim ** -0.5
    scores = kern.scores(query, key, mask, scale)  # [B, Hkv, G*Q, K]
    assert scores.shape == (2, 2, 15, 48) and scores.dtype == torch.float32
    assert torch.isinf(scores[..., 41:]).all()
    out = kern.weighted(torch.softmax(scores, -1), value).view(2, 6, 5, head_dim)
    assert out.dtype == dtype
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(out.double(), _reference(query, key, value, mask, scale), rtol=tol, atol=tol)


@pytest.mark.parametrize("head_dim", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("rows", [1, 2, 7])
def test_bfloat16_scores_are_products_of_the_right_keys(kern, head_dim: int, rows: int) -> None:
    # bfloat16 scores on a CPU with AVX-512 BF16 sum dimension pairs over 16-key blocks turned around
    # (scores_kernel.cpp; head size 16 keeps the lane sums): every score is its own query row's product
    # with its own key, to float32 rounding (a misplaced pair or key would be off by O(1)), whatever the
    # rows (1, 2 and 7 positions of 3 heads a group: row groups of 4 with every remainder), with keys read
    # through the strides of a view into a longer cache, and masked keys -inf.
    has_bf16 = "avx512_bf16" in exact_kernel._cpu()
    assert bool(kern.dp_scores_supported()) == has_bf16
    gen = torch.Generator().manual_seed(head_dim + rows)
    query = torch.randn(1, 6, rows, head_dim, generator=gen).to(torch.bfloat16)
    cache = torch.randn(1, 2, 160, head_dim, generator=gen).to(torch.bfloat16)
    key = cache[:, :, :112]  # a view: the cache's strides
    mask = torch.zeros(1, rows, 112)
    mask[:, :, 90:] = float("-inf")  # a partly hidden block, then a wholly hidden one
    mask[:, 0, 16:32] = float("-inf")  # one row cannot see a whole block
    scores = kern.scores(query, key, mask, 0.5)
    ref = (query.double().view(1, 2, 3 * rows, head_dim) @ key.double().transpose(-1, -2)) * 0.5
    ref = ref + mask.double().repeat(1, 3, 1)[:, None]
    assert torch.equal(torch.isinf(scores), torch.isinf(ref))
    seen = torch.isfinite(ref)
    assert (scores.double() - ref)[seen].abs().max() <= 1e-6 * ref[seen].abs().max() * head_dim ** 0.5


def test_a_rows_products_depend_only_on_its_visible_keys(kern) -> None:
    # One row (position 0 of each query head in a group) sees 37 keys. Its scores, and its value sum for
    # given weights, come out bit for bit the same with 1 or 9 query rows beside it, 48 or 320 keys in the
    # pass (the rest masked), and with masked keys between its visible ones (a tree branch's view of the
    # cache): every output is one fixed sequence of float operations over the row's own keys. (The softmax
    # between the two products: the tests below.)
    gen = torch.Generator().manual_seed(0)
    d, visible = 64, 37
    keys = torch.randn(1, 3, visible, d, generator=gen).to(torch.bfloat16)
    values = torch.randn(1, 3, visible, d, generator=gen).to(torch.bfloat16)
    row = torch.randn(1, 9, 1, d, generator=gen).to(torch.bfloat16)
    weights = torch.softmax(torch.randn(1, 3, 3, visible, generator=gen), -1)  # [1, Hkv, G, visible]
    results = []
    for rows, width, gaps in ((1, 48, ()), (10, 48, ()), (10, 320, ()), (4, 320, (3, 17, 30))):
        at = torch.arange(visible)
        for g in gaps:  # a masked key before visible key g (so every later one moves up)
            at[g:] += 1
        key = torch.randn(1, 3, width, d, generator=gen).to(torch.bfloat16)
        value = torch.randn(1, 3, width, d, generator=gen).to(torch.bfloat16)
        key[:, :, at], value[:, :, at] = keys, values
        query = torch.randn(1, 9, rows, d, generator=gen).to(torch.bfloat16)
        query[:, :, :1] = row
        mask = torch.randn(1, rows, width)
        mask[0, 0] = float("-inf")
        mask[0, 0, at] = 0.0
        mine = [g * rows for g in range(3)]  # rows of [Hkv, G*Q] for position 0 of each head in the group
        scores = kern.scores(query, key, mask, 0.125)  # [1, 3, 3*rows, width]
        probs = torch.softmax(torch.randn(1, 3, 3 * rows, width, generator=gen), -1)
        placed = torch.zeros(1, 3, 3, width)
        placed[..., at] = weights
        probs[:, :, mine] = placed
        out = kern.weighted(probs, value)
        results.append((scores[:, :, mine][..., at], out[:, :, mine]))
    for scores, out in results[1:]:
        assert torch.equal(scores, results[0][0]) and torch.equal(out, results[0][1])


def test_trees_are_gap_free_on_the_kernel_only(kern, monkeypatch: pytest.MonkeyPatch) -> None:
    # On the kernel (scores one dot product each, the softmax's sum in fixed point, value sums one key at
    # a time) a tree's keys may sit anywhere: engine/attention.py key_layout gives GAP_FREE. The matmul
    # path (float32; bfloat16 with a head size the kernel does not take, or with the kernel off) keeps
    # the period, block and pair rules.
    assert attention.key_layout(torch.bfloat16, 64) == attention.GAP_FREE
    assert attention.key_layout(torch.float32, 64) == attention.KeyLayout()
    assert attention.key_layout(torch.bfloat16, 48) == attention.KeyLayout()
    monkeypatch.setattr(exact_kernel, "_built", {"module": None, "why": "off"})
    assert attention.key_layout(torch.bfloat16, 64) == attention.KeyLayout()


def test_the_softmax_is_a_softmax(kern) -> None:
    # Against float64: as close as torch's float32 softmax (both round score - max in float32 first);
    # masked keys weigh exactly 0, and a row with every key masked gets zeros (not NaN).
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(50, 3, 320, generator=gen) * 6
    scores[:, :, 250:] = float("-inf")
    scores[7, 1] = float("-inf")
    ref = torch.softmax(scores.double(), -1).nan_to_num(0.0)
    out = kern.softmax_(scores.clone())
    assert out.data_ptr() != scores.data_ptr()  # (a clone: in place on its argument)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-9)
    assert (out[:, :, 250:] == 0).all() and (out[7, 1] == 0).all()
    assert torch.allclose(out.double().sum(-1)[out.sum(-1) > 0], torch.ones(1, dtype=torch.float64), atol=1e-5)


def test_a_rows_probabilities_depend_only_on_its_visible_keys(kern) -> None:
    # The same visible scores at other indices (masked keys between them), among other key counts and
    # beside other rows: the same probabilities, bit for bit (torch's softmax sums in 16 lanes, so there a
    # key moved by a gap changes the row).
    gen = torch.Generator().manual_seed(1)
    for _ in range(40):
        visible = int(torch.randint(1, 300, (1,), generator=gen))
        row = torch.randn(visible, generator=gen) * 4
        alone = torch.full((1, -(-visible // 16) * 16), float("-inf"))
        alone[0, :visible] = row
        width = 16 * int(torch.randint(-(-visible // 16) + 1, 40, (1,), generator=gen))
        at = torch.randperm(width, generator=gen)[:visible].sort().values  # visible keys, gaps between
        among = torch.randn(3, width, generator=gen)
        among[1] = float("-inf")
        among[1, at] = row
        a, b = kern.softmax_(alone)[0, :visible], kern.softmax_(among)[1]
        hidden = torch.ones(width, dtype=torch.bool)
        hidden[at] = False
        assert torch.equal(a, b[at]) and (b[hidden] == 0).all()


def test_the_softmax_refuses_what_it_cannot_take(kern) -> None:
    with pytest.raises(RuntimeError, match="multiple of 16"):
        kern.softmax_(torch.zeros(2, 20))
    with pytest.raises(RuntimeError, match="float32"):
        kern.softmax_(torch.zeros(2, 32, dtype=torch.float64))


def test_zero_weights_add_nothing(kern) -> None:
    # A value row that is never weighted (probability exactly 0) does not reach the sum, even when it
    # holds infinities; a weighted one does.
    value = torch.randn(1, 1, 32, 16).to(torch.bfloat16)
    value[0, 0, 5] = float("inf")
    probs = torch.zeros(1, 1, 2, 32)
    probs[0, 0, 0, :5] = 0.2
    probs[0, 0, 1, 5] = 1.0
    out = kern.weighted(probs, value)
    assert torch.isfinite(out[0, 0, 0]).all() and torch.isinf(out[0, 0, 1]).all()


def test_shapes_it_cannot_take_are_refused(kern) -> None:
    q = torch.zeros(1, 2, 1, 24, dtype=torch.bfloat16)  # head size 24: not lanes of 16
    with pytest.raises(RuntimeError, match="multiple of 16"):
        kern.scores(q, torch.zeros(1, 1, 16, 24, dtype=torch.bfloat16), None, 1.0)
    q = torch.zeros(1, 2, 1, 16, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="key count"):
        kern.scores(q, torch.zeros(1, 1, 20, 16, dtype=torch.bfloat16), None, 1.0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("head_dim", [16, 64])
@pytest.mark.parametrize("masked", [True, False])
def test_attend_is_the_three_steps_in_one_call(kern, dtype: torch.dtype, head_dim: int, masked: bool) -> None:
    # attend = weighted(softmax_(scores)), laid out [B, Q, H, D] as the attention functions return it:
    # bit for bit, grouped heads (6 over 3), 2 sequences, 4 rows, 64 keys (a row's last keys masked)
    gen = torch.Generator().manual_seed(head_dim)
    query = torch.randn(2, 6, 4, head_dim, generator=gen).to(dtype)
    key = torch.randn(2, 3, 64, head_dim, generator=gen).to(dtype)
    value = torch.randn(2, 3, 64, head_dim, generator=gen).to(dtype)
    mask = torch.zeros(2, 4, 64)
    mask[:, 1, 50:] = float("-inf")
    mask = mask if masked else None
    steps = kern.weighted(kern.softmax_(kern.scores(query, key, mask, 0.125)), value)  # [B, Hkv, G*Q, D]
    want = steps.view(2, 6, 4, head_dim).transpose(1, 2)
    out = kern.attend(query, key, value, mask, 0.125)
    assert out.shape == (2, 4, 6, head_dim) and out.is_contiguous() and out.dtype == dtype
    assert torch.equal(out, want)
    with pytest.raises(RuntimeError, match="value"):
        kern.attend(query, key, value[:, :, :48], mask, 0.125)


def test_exact_attention_runs_bfloat16_on_the_kernel(kern, monkeypatch: pytest.MonkeyPatch) -> None:
    # In an exact pass, bfloat16 attention goes through the kernel, scores, softmax and value sums (keys not
    # a multiple of 16 are padded with masked zeros), and agrees with float64 attention; float32 and
    # float64 passes keep the matmul path.
    calls: list[str] = []
    real = exact_kernel.kernel

    class Counting:
        def __getattr__(self, name: str):
            calls.append(name)
            return getattr(real(), name)

    monkeypatch.setattr(exact_kernel, "kernel", lambda: Counting())
    gen = torch.Generator().manual_seed(3)
    # 48 keys (whole 16-key blocks, as exact passes have them): the three steps in one call
    for keys, dtype, used in ((40, torch.bfloat16, ["scores", "softmax_", "weighted"]), (48, torch.bfloat16, ["attend"]),
                              (40, torch.float32, []), (40, torch.float64, [])):
        calls.clear()
        query = torch.randn(1, 4, 3, 16, generator=gen).to(dtype)
        key = torch.randn(1, 2, keys, 16, generator=gen).to(dtype)
        value = torch.randn(1, 2, keys, 16, generator=gen).to(dtype)
        mask = torch.zeros(1, 1, 3, keys, dtype=torch.promote_types(dtype, torch.float32))
        mask[..., 33:] = float("-inf")
        with exact_passes():
            out, _ = exact_attention(None, query, key, value, mask, scaling=0.25)  # [B, Q, H, D]
        assert calls == used, (keys, dtype)
        tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
        torch.testing.assert_close(out.transpose(1, 2).double(), _reference(query, key, value, mask[:, 0], 0.25),
                                   rtol=tol, atol=tol)


def test_switched_off_it_is_not_built(monkeypatch: pytest.MonkeyPatch) -> None:
    # LOOKAHEAD_EXACT_KERNEL=0: no build, exact passes keep the matmul path, and the device signature says
    # so (cached probes and cost curves of the two paths never mix).
    from lookahead.models.dtypes import device_signature

    monkeypatch.setattr(exact_kernel, "_built", {})
    monkeypatch.setenv(exact_kernel.ENV, "0")
    monkeypatch.setattr(exact_kernel, "_build", lambda: pytest.fail("built although switched off"))
    assert exact_kernel.kernel() is None and not exact_kernel.serves(torch.bfloat16, 64)
    assert exact_kernel.status() == "off (LOOKAHEAD_EXACT_KERNEL=0)"
    # (device_signature is memoised per process: its uncached body)
    assert "|exact kernel off (LOOKAHEAD_EXACT_KERNEL=0)|" in device_signature.__wrapped__() + "|"


def test_a_failed_build_falls_back_and_says_why(monkeypatch: pytest.MonkeyPatch, tmp_path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    # A source that does not compile (as a missing compiler would): no kernel, one warning naming the
    # reason and what to install, and attention still runs (on the matmul path).
    broken = tmp_path / "exact_kernel.cpp"
    broken.write_text("this is not C++\n")
    monkeypatch.setattr(exact_kernel, "_built", {})
    monkeypatch.setattr(exact_kernel, "SOURCE", broken)
    monkeypatch.setenv("LOOKAHEAD_CACHE", str(tmp_path / "cache"))
    with caplog.at_level(logging.WARNING, logger=exact_kernel.__name__):
        assert exact_kernel.kernel() is None
        assert exact_kernel.kernel() is None  # decided once
    assert exact_kernel.status().startswith("build failed")
    assert [r.getMessage() for r in caplog.records if "unavailable" in r.getMessage()][0].count("compiler") == 1
    assert len([r for r in caplog.records if "unavailable" in r.getMessage()]) == 1
    query = torch.randn(1, 2, 1, 16).to(torch.bfloat16)
    key = value = torch.randn(1, 1, 16, 16).to(torch.bfloat16)
    with exact_passes():
        out, _ = attention.exact_attention(None, query, key, value, torch.zeros(1, 1, 1, 16), scaling=0.25)
    assert out.shape == (1, 1, 2, 16)


def test_the_padding_helper_appends_zero_keys() -> None:
    t = torch.ones(1, 2, 5, 4)
    assert attention._pad_keys(t, 5) is t
    padded = attention._pad_keys(t, 16)
    assert padded.shape == (1, 2, 16, 4) and padded[..., 5:, :].eq(0).all() and padded[..., :5, :].eq(1).all()
    assert torch.equal(F.pad(t, (0, 0, 0, 11)), padded)
