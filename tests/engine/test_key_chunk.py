"""The exact attention's weighted sum in key chunks (engine/value_sums.py `weighted_sum`, `key_chunk`)."""

from __future__ import annotations

import pytest
import torch

from lookahead.engine import value_sums
from lookahead.engine.attention import exact_passes
from lookahead.engine.value_sums import KEY_ALIGN, key_chunk, weighted_sum


@pytest.mark.parametrize("keys", [200, 256, 700, 1024, 1300, 2100])
@pytest.mark.parametrize("chunk", [256, 512, 1024])
def test_the_chunked_sum_is_theweighted_sum(keys: int, chunk: int) -> None:
    # Whatever the chunking (whole chunks in one batched matmul, a shorter last chunk, keys padded to a
    # multiple of KEY_ALIGN), the result is probs @ value: float64 agrees with one matmul to rounding.
    gen = torch.Generator().manual_seed(keys + chunk)
    probs = torch.rand(3, 5, keys, generator=gen, dtype=torch.float64)
    value = torch.randn(3, keys, 16, generator=gen, dtype=torch.float64)
    out = weighted_sum(probs, value, chunk)
    assert out.shape == (3, 5, 16) and out.dtype == torch.float64
    torch.testing.assert_close(out, probs @ value, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunk", [256, 1024])
def test_keys_past_a_rows_chunk_add_exact_zeros(chunk: int) -> None:
    # A row whose weights end inside the first chunk: the chunks after it hold zero weights, so its sum is
    # the first chunk's matmul alone, bit for bit, at 1, 2 or 3 chunks' worth of keys (and a tail).
    gen = torch.Generator().manual_seed(chunk)
    value = torch.randn(2, 3 * chunk + KEY_ALIGN, 8, generator=gen).to(torch.bfloat16)
    row = torch.rand(2, 1, chunk - 10, generator=gen).to(torch.bfloat16)
    alone = weighted_sum(torch.nn.functional.pad(row, (0, 10)), value[:, :chunk], chunk)
    for keys in (2 * chunk, 2 * chunk + KEY_ALIGN, 3 * chunk + KEY_ALIGN):
        probs = torch.nn.functional.pad(row, (0, keys - row.shape[-1]))
        assert torch.equal(weighted_sum(probs, value[:, :keys], chunk), alone), keys


def test_key_chunk_takes_the_widest_invariant_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    # 1024 differs, 512 agrees: 512. Measured once per dtype, head shape and thread count.
    calls: list[int] = []

    def invariant(chunk: int, *shape: object) -> bool:
        calls.append(chunk)
        return chunk <= 512

    monkeypatch.setattr(value_sums, "_chunks", {})
    monkeypatch.setattr(value_sums, "_sums_invariant", invariant)
    assert key_chunk(torch.bfloat16, 3, 3, 64) == 512
    assert key_chunk(torch.bfloat16, 3, 3, 64) == 512
    assert calls == [1024, 512]


def test_key_chunk_falls_back_to_the_narrowest(monkeypatch: pytest.MonkeyPatch) -> None:
    # No wider chunk agrees (float32 MKL on Zen 4 summed 200 keys otherwise at 256 and 512 keys): KEY_ALIGN,
    # which the width probe then checks with the whole model like any other.
    monkeypatch.setattr(value_sums, "_chunks", {})
    monkeypatch.setattr(value_sums, "_sums_invariant", lambda chunk, *shape: False)
    assert key_chunk(torch.float32, 3, 3, 64) == KEY_ALIGN


def test_the_invariance_check_catches_a_sum_that_depends_on_the_key_count(monkeypatch: pytest.MonkeyPatch) -> None:
    # A weighted sum whose result moves with the number of keys in the pass (a kernel that reduces more
    # keys in another order) must not pass the check at any chunk wider than KEY_ALIGN.
    real = value_sums.weighted_sum

    def drifting(probs: torch.Tensor, value: torch.Tensor, chunk: int = KEY_ALIGN) -> torch.Tensor:
        out = real(probs, value, chunk)
        return out + probs.shape[-1] * 1e-3 if probs.shape[-1] > KEY_ALIGN else out

    monkeypatch.setattr(value_sums, "weighted_sum", drifting)
    assert not value_sums._sums_invariant(512, torch.float32, 1, 2, 8)


def test_exact_passes_refuses_a_chunk_off_the_key_alignment() -> None:
    with pytest.raises(ValueError, match="multiple of"):
        with exact_passes((), KEY_ALIGN + 64):
            pass
