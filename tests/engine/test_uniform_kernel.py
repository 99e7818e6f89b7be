"""PyTorch's CPU uniform draws on lookahead's kernel (engine/uniform_kernel.cpp) and the sampling noise built
from them.

The reference is torch.rand itself: the seeded sampling rule was written with it, so the kernel must give
its values bit for bit, or a seed would draw other tokens than it did before.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from lookahead.config import SamplingConfig
from lookahead.engine import exact_kernel, sampling
from lookahead.engine.sampling import TokenChooser


def kernel():
    kern = exact_kernel.kernel()
    assert kern is not None, exact_kernel.status()
    return kern


def torch_rand(seed: int, n: int) -> torch.Tensor:
    return torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)


# 0 and 1: the smallest seeds; 2**32 - 1, 2**32 and 2**32 + 1: where the generator's 32-bit seed wraps (2**32
# seeds as 0); 2**63 - 1: the largest seed the chooser makes; the last: one the chooser made for seed 3 at
# position 7 (its mix of seed and position).
SEEDS = (0, 1, 2**32 - 1, 2**32, 2**32 + 1, 2**63 - 1, ((3 * sampling._MIX) ^ (7 * 0x2545F4914F6CDD1D)) % 2**63)
# 624 words a twist: lengths inside the first, at its end, one past it, across several; SmolLM2's and
# Gemma 3's vocabularies.
LENGTHS = (0, 1, 623, 624, 625, 1248, 1249, 5000, 49_152, 262_144)


@pytest.mark.parametrize("seed", SEEDS)
def test_mt_uniform_is_torch_rand_bit_for_bit(seed: int) -> None:
    kern = kernel()
    for n in LENGTHS:
        got = kern.mt_uniform(seed, n)
        assert got.dtype == torch.float32 and got.shape == (n,)
        assert torch.equal(got, torch_rand(seed, n)), (seed, n)


def test_mt_uniform_checks_its_input() -> None:
    kern = kernel()
    with pytest.raises(RuntimeError, match="seed must be >= 0"):
        kern.mt_uniform(-1, 10)
    with pytest.raises(RuntimeError, match="n must be >= 0"):
        kern.mt_uniform(1, -1)


def test_the_choosers_noise_is_the_rule_written_with_torch_rand() -> None:
    # The rule as it was first written: torch.rand from a generator seeded by (seed, position), clamped,
    # then -log(-log(u)). The chooser draws u on the kernel (loaded here) and must give the same floats.
    kernel()
    sampling._uniform_checked.clear()
    for seed, vocab in ((0, 1000), (3, 49_152), (2**40 + 9, 777)):
        chooser = TokenChooser(SamplingConfig(1.0, seed=seed), vocab_size=vocab)
        for position in (0, 1, 17, 4096):
            mixed = ((seed * sampling._MIX) ^ (position * 0x2545F4914F6CDD1D)) % (2**63)
            u = torch_rand(mixed, vocab)
            expected = -torch.log(-torch.log(u.clamp_(min=1e-20, max=1.0 - 1e-7)))
            assert torch.equal(chooser.gumbel(position), expected), (seed, vocab, position)
    assert sampling._uniform_checked["agrees"] is True


def test_uniform_keeps_torch_rand_where_the_kernel_disagrees(monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    # A kernel whose draws are not torch.rand's (a PyTorch whose generator changed, say) is checked once,
    # refused with a warning, and never used: the draws stay torch.rand's.
    calls = []

    def wrong(seed: int, n: int) -> torch.Tensor:
        calls.append(seed)
        return torch.zeros(n)

    monkeypatch.setattr(exact_kernel, "loaded", lambda: SimpleNamespace(mt_uniform=wrong))
    monkeypatch.setattr(sampling, "_uniform_checked", {})
    with caplog.at_level(logging.WARNING, logger=sampling.__name__):
        assert torch.equal(sampling.uniform(5, 100), torch_rand(5, 100))
        assert torch.equal(sampling.uniform(6, 100), torch_rand(6, 100))
    assert sampling._uniform_checked == {"agrees": False}
    assert len(calls) == 1  # the check's first seed failed; nothing drew on it afterwards
    assert sum("differs" in r.message for r in caplog.records) == 1
