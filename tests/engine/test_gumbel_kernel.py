"""The seeded sampling rule's choice decided from the uniform draws alone (engine/gumbel_kernel.cpp) and
where the chooser takes it.

The reference is the rule written out in PyTorch: argmax(x.float() / temperature, -inf below the row's
floor, + the noise -log(-log(clamp(u)))), its first maximum. Where the kernel says a row is decided, its
token must be that one; rows it leaves undecided must be only the ones bounds cannot settle (near ties,
NaN, nothing kept), and few.
"""

from __future__ import annotations

import logging

import pytest
import torch

from lookahead.config import SamplingConfig
from lookahead.engine import exact_kernel, sampling
from lookahead.engine.sampling import TokenChooser, gumbel_noise

from .test_topk_kernel import kernel, rows_of_every_kind


def reference(x: torch.Tensor, temperature: float, uniforms: list[torch.Tensor],
              floors: torch.Tensor | None = None) -> list[int]:
    q = x.float() / temperature  # [R, V]
    if floors is not None:
        q = q.masked_fill(q < floors[:, None], float("-inf"))
    return (q + torch.stack([gumbel_noise(u) for u in uniforms])).argmax(dim=-1).tolist()


def draws(rows: int, vocab: int, seed: int) -> list[torch.Tensor]:
    return [sampling.uniform(seed * 1000 + r, vocab) for r in range(rows)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("vocab", [1, 15, 16, 37, 4099, 49_152])
def test_decided_rows_are_the_rules_choice(dtype: torch.dtype, vocab: int) -> None:
    # Rows of every kind (ties, half -inf, a few finite values, the maximum in the scalar tail, a constant
    # row) at temperatures from near-greedy to flat, with and without floors (a top-k's k-th value).
    kern = kernel()
    decided_rows = total = 0
    for seed, temperature in enumerate((0.05, 0.7, 1.0, 2.5)):
        x = rows_of_every_kind(vocab, dtype, seed=vocab + seed)[:6].contiguous()  # rows 6-7 are plain randn
        us = draws(6, vocab, seed)
        q = x.float() / temperature
        kth = torch.topk(q, min(3, vocab), dim=-1).values[:, -1].contiguous()
        for floors in (None, kth):
            chosen, decided = kern.gumbel_choice(x, temperature, us, floors)
            expected = reference(x, temperature, us, floors)
            for r in range(6):
                if decided[r]:
                    assert int(chosen[r]) == expected[r], (vocab, temperature, r, floors is not None)
            decided_rows += int(decided.sum())
            total += 6
    # Only the all -inf row (row 3 at vocab 1, say) or a true near tie may be left; here that is rare.
    assert decided_rows >= 0.9 * total, (decided_rows, total)


def test_near_ties_and_exact_ties_are_left_to_the_noise_rows() -> None:
    kern = kernel()
    x = torch.zeros(2, 64)
    u = torch.full((64,), 0.5)  # row 0: every token the same score: argmax's first, which bounds cannot tell
    v = torch.full((64,), 0.01)
    v[10], v[40] = 0.9, 0.9  # row 1: two tokens of equal noise, their x 1e-4 apart (1e-3 bounds overlap)
    x[1, 40] = 1e-4
    chosen, decided = kern.gumbel_choice(x.contiguous(), 1.0, [u, v], None)
    assert decided.tolist() == [False, False]
    x[1, 40] = 0.05  # far enough apart: decided, and the larger one wins
    chosen, decided = kern.gumbel_choice(x.contiguous(), 1.0, [u, v], None)
    assert decided.tolist() == [False, True] and int(chosen[1]) == 40 == reference(x, 1.0, [u, v])[1]


def test_rows_bounds_cannot_settle_are_undecided() -> None:
    # NaN logits or draws (PyTorch's argmax would pick the NaN), +inf, x / t overflowing, nothing kept.
    kern = kernel()
    vocab = 100
    base = torch.randn(1, vocab, generator=torch.Generator().manual_seed(0))
    u = draws(1, vocab, 3)[0]
    cases = []
    for at in (5, 99):  # in the vectorised body and in the scalar tail
        nan = base.clone()
        nan[0, at] = float("nan")
        inf = base.clone()
        inf[0, at] = float("inf")
        cases += [(nan, 1.0, u, None), (inf, 1.0, u, None)]
        nan_u = u.clone()
        nan_u[at] = float("nan")
        cases.append((base, 1.0, nan_u, None))
    huge = base.clone()
    huge[0, 7] = 3e38
    cases.append((huge, 0.01, u, None))  # 3e38 / 0.01 is +inf in float32
    cases.append((torch.full((1, vocab), float("-inf")), 1.0, u, None))
    cases.append((base, 1.0, u, torch.tensor([float(base.max()) + 1.0])))  # a floor above every value
    for x, t, draw, floors in cases:
        assert kern.gumbel_choice(x.contiguous(), t, [draw], floors)[1].tolist() == [False]


def test_extreme_and_out_of_range_draws_keep_the_bounds() -> None:
    # u = 0 and the largest draw (both clamped by the rule), and values no generator gives (1.0, 1.5, -0.5):
    # wherever the kernel decides, it is the rule's choice with PyTorch's clamp.
    kern = kernel()
    g = torch.Generator().manual_seed(5)
    for trial in range(40):
        x = (torch.randn(1, 300, generator=g) * 0.5).contiguous()
        u = torch.rand(300, generator=g)
        at = torch.randint(0, 300, (6,), generator=g)
        u[at] = torch.tensor([0.0, 1.0 - 2.0**-24, 1.0 - 2.0**-23, 1.0, 1.5, -0.5])
        chosen, decided = kern.gumbel_choice(x, 1.0, [u], None)
        if decided[0]:
            assert int(chosen[0]) == reference(x, 1.0, [u])[0], trial


def test_gumbel_choice_checks_its_input() -> None:
    kern = kernel()
    x = torch.zeros(2, 8)
    u = [torch.rand(8), torch.rand(8)]
    with pytest.raises(RuntimeError, match="bfloat16 or float32"):
        kern.gumbel_choice(x.double(), 1.0, u, None)
    with pytest.raises(RuntimeError, match="one uniform row per row"):
        kern.gumbel_choice(x, 1.0, u[:1], None)
    with pytest.raises(RuntimeError, match="V values"):
        kern.gumbel_choice(x, 1.0, [torch.rand(8), torch.rand(9)], None)
    with pytest.raises(RuntimeError, match="temperature must be > 0"):
        kern.gumbel_choice(x, 0.0, u, None)
    with pytest.raises(RuntimeError, match="floors"):
        kern.gumbel_choice(x, 1.0, u, torch.zeros(3))


class Recording:
    """lookahead's extension with its two sampled-choice calls counted (rows asked of each)."""

    def __init__(self, kern: object) -> None:
        self.kern = kern
        self.rows = {"gumbel_choice": 0, "sampled_choice": 0}

    def __getattr__(self, name: str) -> object:
        real = getattr(self.kern, name)
        if name not in self.rows:
            return real

        def counted(x: torch.Tensor, *args: object) -> object:
            self.rows[name] += x.shape[0]
            return real(x, *args)
        return counted


def test_the_chooser_decides_most_rows_from_the_draws(monkeypatch: pytest.MonkeyPatch) -> None:
    # The same tokens as PyTorch's path under every rule, and the noise row computed only for the rows the
    # draws leave undecided (so `_noise` stays nearly empty).
    recording = Recording(kernel())
    monkeypatch.setattr(exact_kernel, "loaded", lambda: recording)
    x = torch.randn(8, 49_152, generator=torch.Generator().manual_seed(8)).mul(4).to(torch.bfloat16)
    for cfg in (SamplingConfig(temperature=0.7, seed=3), SamplingConfig(temperature=1.0, seed=3, top_p=0.9),
                SamplingConfig(temperature=0.8, seed=3, top_k=40)):
        fast, slow = TokenChooser(cfg, vocab_size=49_152), TokenChooser(cfg, vocab_size=49_152)
        monkeypatch.setattr(slow, "_kernel_choice", lambda *a: None)  # PyTorch's path, the reference
        for start in range(0, 80, 8):
            positions = list(range(start, start + 8))
            assert fast.choose(x, positions) == slow.choose(x, positions), (cfg, start)
        assert len(fast._noise) <= 2, cfg  # 80 positions, their noise rows almost never needed
    assert recording.rows["gumbel_choice"] == 3 * 80
    assert recording.rows["sampled_choice"] <= 6


def test_a_logarithm_that_strays_keeps_the_noise_rows(monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    # A PyTorch whose float32 noise strays from the double one by more than the tolerance (a less accurate
    # logarithm) is found once, with a warning, and its choices all come from the noise rows.
    recording = Recording(kernel())
    monkeypatch.setattr(exact_kernel, "loaded", lambda: recording)
    monkeypatch.setattr(sampling, "_noise_checked", {})
    monkeypatch.setattr(sampling, "gumbel_noise", lambda u: gumbel_noise(u) + 1e-4)
    x = torch.randn(4, 1000, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    cfg = SamplingConfig(temperature=0.7, seed=2)
    chooser, slow = TokenChooser(cfg, vocab_size=1000), TokenChooser(cfg, vocab_size=1000)
    monkeypatch.setattr(slow, "_kernel_choice", lambda *a: None)  # PyTorch's path with that noise
    with caplog.at_level(logging.WARNING, logger=sampling.__name__):
        for positions in ([0, 1, 2, 3], [4, 5, 6, 7]):
            assert chooser.choose(x, positions) == slow.choose(x, positions)
    assert sampling._noise_checked == {"close": False}
    assert recording.rows == {"gumbel_choice": 0, "sampled_choice": 8}
    assert sum("strays" in r.message for r in caplog.records) == 1
