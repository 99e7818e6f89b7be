"""Each row's k largest logits on lookahead's kernel (engine/topk_kernel.cpp) and where sampling uses it.

The reference is the slow, obvious rule: a stable descending sort of the whole row, its first k (equal
values by ascending index). Values must equal torch.topk's; indices must equal the stable sort's.
"""

from __future__ import annotations

import pytest
import torch

from lookahead.config import SamplingConfig
from lookahead.engine import exact_kernel, sampling
from lookahead.engine.sampling import TokenChooser, largest


def kernel():
    kern = exact_kernel.kernel()
    assert kern is not None, exact_kernel.status()
    return kern


def stable_top(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    values, indices = torch.sort(x.float(), dim=-1, descending=True, stable=True)
    return values[:, :k].to(x.dtype), indices[:, :k]


def rows_of_every_kind(vocab: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Plain rows, rows of many ties (rounded), a row half -inf, a row with fewer than 8 finite values, a
    row whose maximum sits in its last element (the scalar tail past whole vectors), a constant row."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, vocab, generator=g) * 3
    x[1] = x[1].round()
    x[2, : vocab // 2] = float("-inf")
    x[3] = float("-inf")
    x[3, torch.randperm(vocab, generator=g)[: min(5, vocab)]] = torch.randn(min(5, vocab), generator=g)
    x[4, -1] = 100.0
    x[5] = 0.25
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("vocab", [1, 7, 16, 33, 49_152, 262_144])
def test_top_rows_are_the_stable_sorts_first_k(dtype: torch.dtype, vocab: int) -> None:
    kern = kernel()
    x = rows_of_every_kind(vocab, dtype, seed=vocab)
    for k in (1, 2, 8, 20):
        if k > vocab:
            continue
        values, indices, nan = kern.top_rows(x, k)
        want_values, want_indices = stable_top(x, k)
        assert not nan and values.dtype == dtype and indices.dtype == torch.int64
        assert torch.equal(values, torch.topk(x, k, dim=-1).values)  # torch's values, ...
        assert torch.equal(values, want_values) and torch.equal(indices, want_indices), (vocab, k)  # ... ties by index
        if k == 1:
            assert torch.equal(indices[:, 0], x.float().argmax(dim=-1))  # argmax's first maximum
        for r in range(x.shape[0]):  # a row alone gets what it gets beside the others
            alone_values, alone_indices, _ = kern.top_rows(x[r : r + 1].contiguous(), k)
            assert torch.equal(alone_values[0], values[r]) and torch.equal(alone_indices[0], indices[r])


def test_top_rows_reports_nan_and_largest_falls_back_to_torch() -> None:
    kern = kernel()
    x = torch.randn(3, 100, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    x[1, 40] = float("nan")
    assert kern.top_rows(x, 4)[2] is True
    assert kern.top_rows(x[[0, 2]].contiguous(), 4)[2] is False
    values, indices = largest(x, 4)
    want = torch.topk(x, 4, dim=-1)  # ranks the NaN first, as torch does
    assert torch.equal(indices, want.indices) and torch.equal(values.isnan(), want.values.isnan())


def test_top_rows_checks_its_input() -> None:
    kern = kernel()
    with pytest.raises(RuntimeError, match="bfloat16 or float32"):
        kern.top_rows(torch.zeros(2, 10, dtype=torch.float64), 2)
    with pytest.raises(RuntimeError, match="k must be"):
        kern.top_rows(torch.zeros(2, 10), 11)
    with pytest.raises(RuntimeError, match="contiguous"):
        kern.top_rows(torch.zeros(10, 2).t(), 1)


def test_largest_and_the_greedy_choice_take_the_kernel() -> None:
    kernel()  # loaded: sampling uses it for bfloat16 and float32 rows
    x = rows_of_every_kind(49_152, torch.bfloat16, seed=3)
    values, indices = largest(x, 8)
    assert torch.equal(indices, stable_top(x, 8)[1])  # ties by index: the kernel's order, not torch.topk's
    chooser = TokenChooser(SamplingConfig(), vocab_size=49_152)
    assert chooser.choose(x, list(range(8))) == x.float().argmax(dim=-1).tolist()
    # float64 (the exact test models) stays on PyTorch
    assert sampling._kernel_top(x.double(), 8) is None
    assert largest(x.double(), 8).values.dtype == torch.float64
