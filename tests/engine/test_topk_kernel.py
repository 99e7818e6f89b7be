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


# -- the sampled choice: argmax(logits / temperature + noise) in one pass ------------------------------


def torch_choice(x: torch.Tensor, temperature: float, noise: list[torch.Tensor]) -> list[int]:
    """The rule as PyTorch computes it (engine/sampling.py before the kernel): widen, divide, add, argmax."""
    return (x.float() / temperature + torch.stack(noise)).argmax(dim=-1).tolist()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("vocab", [1, 7, 16, 33, 49_152])
def test_sampled_choice_is_pytorchs_argmax_of_the_noisy_logits(dtype: torch.dtype, vocab: int) -> None:
    kern = kernel()
    x = rows_of_every_kind(vocab, dtype, seed=vocab + 1)
    chooser = TokenChooser(SamplingConfig(temperature=0.7, seed=5), vocab_size=vocab)
    noise = [chooser.gumbel(p) for p in range(8)]
    for temperature in (0.7, 1.0, 0.3, 1.7, 0.1234567):  # 0.7 and 0.3: not exact in float32, nor their inverses
        chosen, nan = kern.sampled_choice(x, temperature, noise, None)
        assert not nan and chosen.dtype == torch.int64
        assert chosen.tolist() == torch_choice(x, temperature, noise), (vocab, temperature)
        for r in range(x.shape[0]):  # a row alone gets what it gets beside the others
            alone, _ = kern.sampled_choice(x[r : r + 1].contiguous(), temperature, noise[r : r + 1], None)
            assert alone.tolist() == [chosen[r].item()]


def test_sampled_choice_takes_the_first_of_equal_maxima() -> None:
    # Zero noise on a rounded row: the maximum occurs many times, across vector lanes and in the scalar
    # tail past the last whole vector (37 = 2 * 16 + 5); argmax's answer is its first index.
    kern = kernel()
    for vocab in (37, 49_152):
        x = torch.zeros(4, vocab)
        x[0, [3, 20, 35]] = 2.0  # the first maximum in lane 3 of vector 0; later equal ones in other lanes
        x[1, [19, 3 + 16]] = 1.0  # the same index twice: lane 3 of vector 1
        x[2, [36, vocab - 1]] = 5.0  # only in the tail (vocab 37) or at the end
        x[3] = float("-inf")  # all equal: index 0, as argmax gives
        noise = [torch.zeros(vocab) for _ in range(4)]
        for dtype in (torch.bfloat16, torch.float32):
            xs = x.to(dtype)
            chosen, nan = kern.sampled_choice(xs, 1.0, noise, None)
            assert not nan and chosen.tolist() == torch_choice(xs, 1.0, noise), vocab


def test_sampled_choice_reports_nan_and_checks_its_input() -> None:
    kern = kernel()
    x = torch.randn(2, 40, generator=torch.Generator().manual_seed(2))
    noise = [torch.zeros(40), torch.zeros(40)]
    x[1, 38] = float("nan")  # in the scalar tail
    assert kern.sampled_choice(x, 1.0, noise, None)[1] is True
    assert kern.sampled_choice(x[:1].contiguous(), 1.0, noise[:1], None)[1] is False
    x[1, 38], x[1, 5] = 0.0, float("nan")  # in a whole vector
    assert kern.sampled_choice(x, 1.0, noise, None)[1] is True
    with pytest.raises(RuntimeError, match="one noise row per row"):
        kern.sampled_choice(x, 1.0, noise[:1], None)
    with pytest.raises(RuntimeError, match="V values"):
        kern.sampled_choice(x, 1.0, [torch.zeros(39), torch.zeros(39)], None)
    with pytest.raises(RuntimeError, match="bfloat16 or float32"):
        kern.sampled_choice(x.double(), 1.0, noise, None)


def torch_masked_choice(x: torch.Tensor, temperature: float, noise: list[torch.Tensor], floors: torch.Tensor) -> list[int]:
    """The rule with a cut as PyTorch computes it: widen, divide, mask below the row's floor, add, argmax."""
    q = x.float() / temperature
    return (q.masked_fill(q < floors[:, None], float("-inf")) + torch.stack(noise)).argmax(dim=-1).tolist()


@pytest.mark.parametrize("vocab", [7, 37, 49_152])
def test_sampled_choice_skips_values_below_each_rows_floor(vocab: int) -> None:
    # Floors at each row's k-th largest x / t (k = 1, 2, 5, ...), one at -inf (nothing masked), and rows
    # whose kept values lie only in the scalar tail past the last whole vector or only in its first lanes.
    kern = kernel()
    x = rows_of_every_kind(vocab, torch.float32, seed=vocab + 3)
    x[6, -1] = 50.0  # the only kept value of row 6: the row's last index (the tail for vocab 37)
    x[7, 0] = 50.0  # the only kept value of row 7: index 0
    chooser = TokenChooser(SamplingConfig(temperature=0.9, seed=2), vocab_size=vocab)
    noise = [chooser.gumbel(p) for p in range(8)]
    for temperature in (0.9, 0.3):
        for k in (1, 2, min(5, vocab)):
            for dtype in (torch.bfloat16, torch.float32):
                xs = x.to(dtype)
                floors = (xs.float() / temperature).topk(k, dim=-1).values[:, -1].contiguous()
                floors[1] = float("-inf")
                chosen, nan = kern.sampled_choice(xs, temperature, noise, floors)
                assert not nan and chosen.tolist() == torch_masked_choice(xs, temperature, noise, floors), (k, dtype)
    with pytest.raises(RuntimeError, match="floors must be"):
        kern.sampled_choice(x, 1.0, noise, torch.zeros(7))


@pytest.mark.parametrize("cfg", [
    SamplingConfig(temperature=0.7, seed=9, top_p=0.9),
    SamplingConfig(temperature=1.0, seed=9, top_p=0.95),
    SamplingConfig(temperature=0.8, seed=9, top_k=40),
    SamplingConfig(temperature=1.3, seed=9, top_k=3, top_p=0.5),
    SamplingConfig(temperature=0.7, seed=9, top_k=50, top_p=0.9999999),  # above the row's float sum: top-k alone
    SamplingConfig(temperature=0.7, seed=9, top_p=1e-9),  # the best token alone
])
def test_floors_mask_what_process_logits_masks(cfg: SamplingConfig) -> None:
    kernel()
    x = rows_of_every_kind(49_152, torch.bfloat16, seed=6)
    x[6] = (torch.randn(49_152, generator=torch.Generator().manual_seed(8)) * 6).bfloat16()  # peaky, as models are
    chooser = TokenChooser(cfg, vocab_size=49_152)
    floors = chooser.floors(x)
    q = x.float() / cfg.temperature
    assert torch.equal(sampling.process_logits(x, cfg), q.masked_fill(q < floors[:, None], float("-inf")))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_scaled_is_pytorchs_widened_division(dtype: torch.dtype) -> None:
    kern = kernel()
    for vocab in (1, 37, 49_152):
        x = rows_of_every_kind(vocab, dtype, seed=vocab)
        for temperature in (0.7, 1.0, 0.3, 1.7, 0.1234567):
            got = kern.scaled(x, temperature)
            assert got.dtype == torch.float32 and torch.equal(got, x.float() / temperature), (vocab, temperature)
    with pytest.raises(RuntimeError, match="bfloat16 or float32"):
        kern.scaled(torch.zeros(2, 3, dtype=torch.float64), 1.0)


def test_the_sampled_choice_takes_the_kernel_under_every_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel()  # loaded
    x = rows_of_every_kind(49_152, torch.bfloat16, seed=4)
    calls = []
    for cfg in (SamplingConfig(temperature=0.7, seed=9), SamplingConfig(temperature=1.0, seed=9, top_p=0.9),
                SamplingConfig(temperature=0.8, seed=9, top_k=40), SamplingConfig(temperature=0.6, seed=9, top_k=20, top_p=0.8)):
        fast = TokenChooser(cfg, vocab_size=49_152)
        slow = TokenChooser(cfg, vocab_size=49_152)
        monkeypatch.setattr(slow, "_kernel_choice", lambda *a: None)  # PyTorch's path, the reference
        real = fast._kernel_choice
        monkeypatch.setattr(fast, "_kernel_choice", lambda *a: calls.append(cfg) or real(*a))
        for start in range(0, 400, 8):  # 50 positions' noise for each row
            positions = list(range(start, start + 8))
            assert fast.choose(x, positions) == slow.choose(x, positions), (cfg, start)
        assert real(x, list(range(8))) is not None
    assert len(calls) == 4 * 50
    x[2, 7] = float("nan")  # a NaN: PyTorch decides (temperature alone: argmax picks the NaN)
    assert TokenChooser(SamplingConfig(temperature=0.7, seed=9), vocab_size=49_152).choose(x, list(range(8)))[2] == 7
    cfg = SamplingConfig(temperature=0.7, seed=9, top_p=0.9)  # top-p: NaN probabilities mask the whole row
    fast, slow = TokenChooser(cfg, vocab_size=49_152), TokenChooser(cfg, vocab_size=49_152)
    monkeypatch.setattr(slow, "_kernel_choice", lambda *a: None)
    assert fast._kernel_choice(x, list(range(8))) is None and fast.choose(x, list(range(8))) == slow.choose(x, list(range(8)))


def full_sort_cut(x: torch.Tensor, probs: torch.Tensor, top_p: float) -> list[float]:
    """The top-p cut by the slow rule: the whole row sorted, its probabilities summed in that order."""
    out = []
    for row, p in zip(x, probs):
        order = torch.argsort(row, descending=True, stable=True)
        kept = (torch.cumsum(p[order], dim=0) - p[order]) < top_p
        kept[0] = True
        out.append(float(row[order][int(kept.sum()) - 1]))
    return out


@pytest.mark.parametrize("vocab", [3, 64, 5000, 49_152])
def test_top_p_cuts_where_found_are_the_full_sorts(vocab: int) -> None:
    # Rows of every kind at temperatures that make them peaked or flat, several top_p: a found cut is the
    # full sort's; rows whose cut lies past the k best are not found; peaked rows are mostly found.
    kern = kernel()
    found_any = 0
    for temperature in (0.3, 1.0, 3.0):
        x = (rows_of_every_kind(vocab, torch.float32, seed=vocab) / temperature).contiguous()
        probs = torch.softmax(x, dim=-1)
        for top_p in (1e-30, 0.3, 0.9, 0.95, 0.999):
            for k in {1, min(16, vocab), min(64, vocab)}:
                cuts, found = kern.top_p_cuts(x, probs, top_p, k)
                expected = full_sort_cut(x, probs, top_p)
                for r in range(x.shape[0]):
                    if found[r]:
                        assert float(cuts[r]) == expected[r], (temperature, top_p, k, r)
                found_any += int(found.sum())
    assert found_any > 0


def test_top_p_cuts_leave_rows_near_the_line_past_k_or_nan() -> None:
    kern = kernel()
    x = torch.log(torch.tensor([[0.5, 0.25, 0.125, 0.125], [0.4, 0.3, 0.2, 0.1], [0.4, 0.3, 0.2, 0.1]]))
    x[2, 1] = float("nan")
    probs = torch.softmax(x, dim=-1)
    # top_p 0.75: row 0's mass before rank 2 is 0.75 itself (float32 sums could put it either side); row
    # 1's is 0.7 (kept) and 0.9 before rank 3 (not): the cut is 0.2's value, clear of the line; NaN: left.
    cuts, found = kern.top_p_cuts(x.contiguous(), probs, 0.75, 4)
    assert found.tolist() == [False, True, False]
    assert float(cuts[1]) == float(x[1, 2])
    # Within 1e-5 of the line, not on it: still left (float32 sums of the same values could fall either side).
    assert kern.top_p_cuts(x.contiguous(), probs, 0.75 + 5e-6, 4)[1].tolist()[0] is False
    assert kern.top_p_cuts(x.contiguous(), probs, 0.75 + 5e-5, 4)[1].tolist()[0] is True
    cuts, found = kern.top_p_cuts(x.contiguous(), probs, 0.95, 2)  # row 1's cut is at rank 3: past k = 2
    assert found.tolist()[1] is False
    cuts, found = kern.top_p_cuts(x.contiguous(), probs, 0.95, 4)  # all four walked: rank 3 kept, settled
    assert found.tolist()[1] is True and float(cuts[1]) == float(x[1, 3])


def test_top_p_cuts_checks_its_input() -> None:
    kern = kernel()
    x = torch.zeros(2, 8)
    with pytest.raises(RuntimeError, match="float32"):
        kern.top_p_cuts(x.bfloat16(), x, 0.9, 4)
    with pytest.raises(RuntimeError, match="shaped as x"):
        kern.top_p_cuts(x, torch.zeros(2, 7), 0.9, 4)
    with pytest.raises(RuntimeError, match="k must be"):
        kern.top_p_cuts(x, x, 0.9, 9)
    with pytest.raises(RuntimeError, match="k must be"):
        kern.top_p_cuts(torch.zeros(1, 200), torch.zeros(1, 200), 0.9, 129)
