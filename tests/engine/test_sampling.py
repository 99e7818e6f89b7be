"""Seed-exact sampling: identical sequences across strategies, and the right distribution."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

import lookahead
from lookahead import LookaheadConfig, SamplingConfig
from lookahead.engine import exact_kernel, sampling
from lookahead.engine.sampling import BLOCK, TokenChooser, largest, nucleus, process_logits

from .helpers import model64


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral", "gemma3"])
def test_same_seed_same_sequence_across_strategies(arch: str) -> None:
    lm = model64(arch)
    accepted_somewhere = False
    for seed in range(6):
        s = SamplingConfig(temperature=0.8, top_k=20, top_p=0.95, seed=seed)
        ids = lm.encode("abcabcabcabc abcabc", raw=True)
        ar = lookahead.generate(lm, ids, max_new_tokens=30, strategy="autoregressive", sampling=s)
        la = lookahead.generate(lm, ids, max_new_tokens=30, sampling=s, lookahead=LookaheadConfig(3, 3, 4),
                                adaptive=False)
        assert la.token_ids == ar.token_ids, seed
        accepted_somewhere |= la.stats.guesses_accepted > 0
    assert accepted_somewhere  # sampled guesses were verified and accepted, not just rejected


def test_different_seeds_differ_and_same_seed_repeats() -> None:
    lm = model64("llama")
    outs = [lookahead.generate(lm, "hi", max_new_tokens=20, sampling=SamplingConfig(1.0, seed=s)).token_ids
            for s in (1, 2, 1)]
    assert outs[0] == outs[2]
    assert outs[0] != outs[1]


def test_noise_at_reads_the_positions_own_noise_until_the_position_is_forgotten() -> None:
    # noise_at is a fast read of the position's noise at a few tokens, computed in double from the draws:
    # within 1e-6 of gumbel(position)'s float32 values (not bit for bit: it only orders candidates), tokens
    # in the order given (repeats allowed); a forgotten position's noise is generated again, bit for bit.
    chooser = TokenChooser(SamplingConfig(1.0, seed=7), vocab_size=1000)
    tokens = [999, 0, 512, 0, 3]
    for position in (4, 5):
        near = chooser.noise_at(position, tokens)
        assert near == pytest.approx(chooser.gumbel(position)[torch.tensor(tokens)].tolist(), abs=1e-6)
        assert near[1] == near[3]
    assert chooser.noise_at(4, tokens) != chooser.noise_at(5, tokens)
    before = chooser.noise_at(4, tokens)
    chooser.forget_before(5)
    assert 4 not in chooser._noise and 4 not in chooser._views and 4 not in chooser._draws and 5 in chooser._views
    assert chooser.noise_at(4, tokens) == before


def _scaled(p: np.ndarray, total: float) -> np.ndarray:
    return p / p.sum() * total


def _expected(logits: torch.Tensor, cfg: SamplingConfig) -> np.ndarray:
    return torch.softmax(process_logits(logits[None], cfg)[0], dim=-1).double().numpy()


@pytest.mark.parametrize("cfg", [
    SamplingConfig(temperature=1.0, seed=11),
    SamplingConfig(temperature=0.5, seed=12),
    SamplingConfig(temperature=1.5, top_k=4, seed=13),
    SamplingConfig(temperature=1.0, top_p=0.7, seed=14),
    SamplingConfig(temperature=0.9, top_k=6, top_p=0.9, seed=15),
])
def test_chooser_draws_from_processed_softmax(cfg: SamplingConfig) -> None:
    # Each position gets independent noise: counting picks over positions is a sample of the distribution.
    torch.manual_seed(0)
    logits = torch.randn(10) * 1.5
    expected = _expected(logits, cfg)
    chooser = TokenChooser(cfg, vocab_size=10)
    n = 6000
    picks = [chooser.choose(logits[None], [pos])[0] for pos in range(n)]
    counts = np.bincount(picks, minlength=10)
    assert counts[expected == 0].sum() == 0, "a token outside top-k/top-p was sampled"
    support = expected > 0
    _, p_value = stats.chisquare(counts[support], _scaled(expected[support], counts[support].sum()))
    assert p_value > 1e-3, (counts, expected * n)


def test_top_p_keeps_the_smallest_set_reaching_p(cut_path: str) -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(process_logits(logits, SamplingConfig(temperature=1.0, top_p=0.8)))[0].tolist()
    assert kept == [True, True, False, False]  # 0.5 < 0.8, 0.5 + 0.3 reaches 0.8: stop there
    kept = torch.isfinite(process_logits(logits, SamplingConfig(temperature=1.0, top_p=0.81)))[0].tolist()
    assert kept == [True, True, True, False]


@pytest.mark.parametrize("top_p", [5e-324, 1e-30, 1e-7])
def test_top_p_below_float32_resolution_keeps_the_best_token(top_p: float, cut_path: str) -> None:
    # 5e-324 (the server's fuzzer sent it) becomes 0 in a float32 comparison: the mass before the best
    # token (0) is then not below it, yet the best token must stay (a sample always has a token)
    logits = torch.log(torch.tensor([[0.2, 0.5, 0.3], [0.6, 0.1, 0.3]]))
    kept = torch.isfinite(process_logits(logits, SamplingConfig(temperature=1.0, top_p=top_p))).tolist()
    assert kept == [[False, True, False], [True, False, False]]


def test_top_p_keeps_every_token_tied_with_the_last_one_kept(cut_path: str) -> None:
    # Probabilities 0.4, 0.2, 0.2, 0.2 and top_p 0.5: 0.4 (mass before 0) and one 0.2 (mass before 0.4)
    # are kept, and the next 0.2 (mass before 0.6) would not be; but the three 0.2s are the same value,
    # and which of them a sort puts first is arbitrary, so all three stay: the set is {x >= cut}.
    logits = torch.log(torch.tensor([[0.2, 0.4, 0.2, 0.2]]))
    kept = torch.isfinite(process_logits(logits, SamplingConfig(temperature=1.0, top_p=0.5)))[0].tolist()
    assert kept == [True, True, True, True]
    # top_p 0.4: only the 0.4 (the 0.2s' mass before is 0.4, not below 0.4)
    kept = torch.isfinite(process_logits(logits, SamplingConfig(temperature=1.0, top_p=0.4)))[0].tolist()
    assert kept == [False, True, False, False]


@pytest.fixture(params=["pytorch", "kernel"])
def cut_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The top-p cut found by PyTorch calls alone, or first by lookahead's kernel (`top_p_cuts`)."""
    if request.param == "kernel":
        kern = exact_kernel.kernel()
        assert kern is not None, exact_kernel.status()
        monkeypatch.setattr(exact_kernel, "loaded", lambda: kern)
    else:
        monkeypatch.setattr(exact_kernel, "loaded", lambda: None)
    return str(request.param)


def _nucleus_by_full_sort(x: torch.Tensor, top_p: float) -> torch.Tensor:
    """The slow, obvious rule: sort the whole row, sum the probabilities in that order, cut."""
    out = []
    for row in x:
        probs = torch.softmax(row, dim=-1)
        order = torch.argsort(row, descending=True, stable=True)
        p = probs[order]
        kept = (torch.cumsum(p, dim=0) - p) < top_p
        out.append(row >= row[order][int(kept.sum()) - 1])
    return torch.stack(out)


@pytest.mark.parametrize("top_p", [0.3, 0.9, 0.95, 0.999])
def test_top_p_over_the_best_tokens_equals_the_full_sort_and_ignores_its_companions(top_p: float, cut_path: str) -> None:
    # Rows of every shape the fast path meets: peaked (the cut among the row's first best tokens), flat
    # (the cut far down: the row-by-row floors, down to the whole row), rounded
    # to bfloat16 (many ties), and masked by top-k (-inf). Each row's set must equal the full sort's,
    # and a row decided in a batch must get the set it gets alone.
    gen = torch.Generator().manual_seed(3)
    vocab = 5000
    rows = [torch.randn(vocab, generator=gen) * scale for scale in (12.0, 6.0, 3.0, 1.0, 0.1)]
    rows.append((torch.randn(vocab, generator=gen) * 4).bfloat16().float())
    masked = torch.randn(vocab, generator=gen) * 2
    masked[torch.topk(masked, vocab - 40).indices[40:]] = float("-inf")
    rows.append(masked)
    x = torch.stack(rows)  # [7, V]
    together = nucleus(x, top_p)
    assert torch.equal(together, _nucleus_by_full_sort(x, top_p))
    assert torch.equal(together, torch.cat([nucleus(x[i : i + 1], top_p) for i in range(x.shape[0])]))
    assert together.sum(dim=-1).min() >= 1  # the likeliest token always stays


def test_top_p_cut_at_the_edges_of_the_best_tokens_searched(cut_path: str) -> None:
    # The cut is looked for among a row's FIRST_K (16) best, then its SECOND_K (64) best, then above the
    # floors. A row whose mass sits on r tokens (distinct values, scattered) has its top_p = 0.999 cut at
    # rank r: the mass before rank r is about (r - 1) / r, below 0.999; the mass before rank r + 1 is
    # about 1. Ranks either side of 16 and 64 check that a cut exactly at the last token searched is
    # taken there (the next token's mass before it is the whole mass searched) and one rank further is not.
    assert (sampling.FIRST_K, sampling.SECOND_K) == (16, 64)
    gen = torch.Generator().manual_seed(5)
    vocab = 5000
    rows = []
    for r in (1, 15, 16, 17, 63, 64, 65, 200):
        row = torch.full((vocab,), -30.0)
        row[torch.randperm(vocab, generator=gen)[:r]] = 10.0 + 0.01 * torch.randn(r, generator=gen)
        rows.append(row)
    x = torch.stack(rows)  # [8, V]
    kept = nucleus(x, 0.999)
    assert kept.sum(dim=-1).tolist() == [1, 15, 16, 17, 63, 64, 65, 200]
    assert torch.equal(kept, _nucleus_by_full_sort(x, 0.999))
    assert torch.equal(kept, torch.cat([nucleus(x[i : i + 1], 0.999) for i in range(x.shape[0])]))


@pytest.mark.parametrize("top_p", [0.5, 0.9])
def test_top_p_on_rows_flatter_than_the_probability_floors(top_p: float, cut_path: str) -> None:
    # 49,152 tokens (SmolLM2's vocabulary): a constant row gives every token 2.0e-5, below the first
    # floor (1e-4), so no token reaches it and the cut must come from a lower floor (this raised
    # IndexError until 2026-12-07); a nearly flat row (max 3e-5) likewise. Gemma 3's 262,144 tokens at a
    # high temperature make such rows. Every token tied with the cut stays: a constant row keeps all.
    gen = torch.Generator().manual_seed(4)
    vocab = 49_152
    x = torch.stack([torch.zeros(vocab), torch.randn(vocab, generator=gen) * 0.1])
    assert float(torch.softmax(x, dim=-1).max()) < 1e-4
    kept = nucleus(x, top_p)
    assert torch.equal(kept, _nucleus_by_full_sort(x, top_p))
    assert bool(kept[0].all()) and 0 < int(kept[1].sum()) < vocab


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_greedy_read_off_the_top_k_is_the_first_maximum(dtype: torch.dtype) -> None:
    # Rows of 50 logits, k = 4: a unique maximum (row 0); the maximum at columns 30 and 7, which topk may
    # list in either order (row 1: the first, 7, must win); three ties inside the k (row 2: 5); every
    # one of the k tied, with more ties outside them (row 3: eight ties, the first at column 2; topk picks
    # four of the eight, here not column 2: only argmax sees it).
    rows = torch.randn(4, 50, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(dtype)
    rows[1, 30] = rows[1, 7] = rows[1].max() + 1
    rows[2, 40] = rows[2, 5] = rows[2, 22] = rows[2].max() + 1
    rows[3] = -5.0
    rows[3, [12, 30, 41, 7, 49, 2, 25, 33]] = 2.0
    values, indices = torch.topk(rows, 4, dim=-1)
    top = (values.tolist(), indices.tolist())  # as a step hands them over
    chooser = TokenChooser(SamplingConfig(temperature=0.0), 50)
    assert chooser.choose(rows, [0, 1, 2, 3], top) == rows.argmax(dim=-1).tolist()
    assert chooser.choose(rows, [0, 1, 2, 3], top)[1:] == [7, 5, 2]
    assert all(type(t) is int for t in chooser.choose(rows, [0, 1, 2, 3], top))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_largest_gives_topk_values_from_the_blocks_with_the_largest_maxima(dtype: torch.dtype,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampling, "TWO_PASS_FROM", 0)
    monkeypatch.setattr(sampling, "_kernel_top", lambda logits, k: None)  # PyTorch's path (kernel: test_topk_kernel.py)  # two passes at any vocabulary size
    # 5,000 logits a row (39 whole blocks of 128 and a last block of 8), k = 8: the two-pass path.
    vocab, k = 5000, 8
    assert k * BLOCK * 4 <= vocab
    rows = torch.randn(6, vocab, generator=torch.Generator().manual_seed(3), dtype=torch.float64).to(dtype)
    top = float(rows.float().max()) + 1
    rows[1, 128:136] = top  # row 1: all k largest in one block (block 1), tied: only that block can hold them
    rows[2, 4999] = top  # row 2: the maximum is the very last logit, in the short last block
    rows[2, 4992] = top - 0.5  # ... and the runner-up opens that block
    rows[3, [127, 128, 255, 256]] = top  # row 3: four ties on block edges (blocks 0, 1, 1, 2) ...
    rows[3, 1000] = top + 1  # ... under a unique maximum
    rows[4] = -3.0  # row 4: every logit tied, so any k of them are the k largest
    rows[4, 4500] = 0.0
    values, indices = largest(rows, k)
    expected = torch.topk(rows, k, dim=-1).values
    assert values.dtype == dtype and torch.equal(values, expected)
    assert torch.equal(rows.gather(1, indices), values)  # each index holds its value
    assert all(len(set(r)) == k for r in indices.tolist())  # k distinct logits a row
    assert sorted(indices[1].tolist()) == list(range(128, 136))  # equal values, in no stated order
    assert indices[2, :2].tolist() == [4999, 4992]
    assert indices[3, 0] == 1000 and sorted(indices[3, 1:5].tolist()) == [127, 128, 255, 256]
    assert indices[4, 0] == 4500
    # a row's result does not depend on the rows beside it
    for r in range(rows.shape[0]):
        alone = largest(rows[r : r + 1], k)
        assert torch.equal(alone[0][0], values[r]) and torch.equal(alone[1][0], indices[r])


def test_largest_falls_back_to_topk_where_padding_would_be_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampling, "TWO_PASS_FROM", 0)
    monkeypatch.setattr(sampling, "_kernel_top", lambda logits, k: None)  # PyTorch's path (kernel: test_topk_kernel.py)
    # 4,993 logits: 39 whole blocks and a last block of one logit (column 4992) and 127 of padding (-inf).
    # Row 0 has one logit above -inf, in that last block: its block comes first, and the 7 other places go
    # to -inf values, of which the padding right after column 4992 would be picked first (columns past
    # the vocabulary). Such a row takes torch.topk instead. Row 1: plain.
    rows = torch.full((2, 4993), float("-inf"))
    rows[0, 4992] = 1.0
    rows[1] = torch.arange(4993, dtype=torch.float32)
    values, indices = largest(rows, 8)
    assert int(indices.max()) < 4993
    assert torch.equal(values, torch.topk(rows, 8, dim=-1).values)
    assert indices[0, 0] == 4992 and indices[1].tolist() == list(range(4992, 4984, -1))


def test_vocabularies_under_the_two_pass_size_take_one_topk(monkeypatch: pytest.MonkeyPatch) -> None:
    # SmolLM2's 49,152 tokens and a tiny model's 100, without lookahead's kernel: torch.topk's own result
    monkeypatch.setattr(sampling, "_kernel_top", lambda logits, k: None)
    for vocab in (100, 49_152):
        assert vocab < sampling.TWO_PASS_FROM
        rows = torch.randn(3, vocab, generator=torch.Generator().manual_seed(0)).bfloat16()
        rows[1, [7, 90, 40]] = 20.0
        assert all(torch.equal(a, b) for a, b in zip(largest(rows, 8), torch.topk(rows, 8, dim=-1)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_greedy_read_off_largest_is_the_first_maximum(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampling, "TWO_PASS_FROM", 0)
    monkeypatch.setattr(sampling, "_kernel_top", lambda logits, k: None)  # PyTorch's path (kernel: test_topk_kernel.py)
    # What a lookahead step does: the k largest by `largest`, the greedy token read off them. Ties for the
    # maximum on both sides of a block edge and far apart; the first (column 127) must win.
    rows = torch.randn(3, 6000, generator=torch.Generator().manual_seed(5), dtype=torch.float64).to(dtype)
    rows[0, [5000, 128, 127, 3000]] = float(rows[0].float().max()) + 1
    rows[1, [5999]] = float(rows[1].float().max()) + 1  # the last column
    chooser = TokenChooser(SamplingConfig(temperature=0.0), 6000)
    top = largest(rows, 8)
    chosen = chooser.choose(rows, [0, 1, 2], (top.values.tolist(), top.indices.tolist()))
    assert chosen == rows.argmax(dim=-1).tolist() and chosen[:2] == [127, 5999]


def test_engine_first_token_follows_model_distribution() -> None:
    # The autoregressive sampler end to end: the first sampled token over many seeds vs softmax(logits/T).
    lm = model64("llama")
    ids = lm.encode("hello", raw=True)
    with torch.no_grad():
        logits = lm.model(torch.tensor([ids])).logits[0, -1]
    cfg = SamplingConfig(temperature=2.0, top_k=8)
    expected = _expected(logits, cfg)
    n = 1500
    counts = np.zeros(len(expected))
    for seed in range(n):
        r = lookahead.generate(lm, ids, max_new_tokens=1, strategy="autoregressive",
                               sampling=SamplingConfig(temperature=2.0, top_k=8, seed=seed))
        counts[r.token_ids[0]] += 1
    support = expected > 0
    assert counts[~support].sum() == 0
    _, p_value = stats.chisquare(counts[support], _scaled(expected[support], counts[support].sum()))
    assert p_value > 1e-3
    assert math.isclose(counts.sum(), n)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_greedy_choice_is_the_first_maximum_in_the_logits_own_dtype(dtype: torch.dtype) -> None:
    # The greedy rule widens bf16/fp16 rows to float32 before argmax (faster on CPU). Widening must not
    # change the choice: every bf16/fp16 value is exact in float32, and a float64 row is never narrowed.
    chooser = TokenChooser(SamplingConfig(temperature=0.0), 50)
    rows = torch.randn(6, 50, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(dtype)
    rows[1, 7] = rows[1, 30] = rows[1].max() + 1  # a tie: the first of the two maxima (7) wins
    # 10 and 10 + 1e-12: only a float64 argmax sees that column 9 is larger than column 3
    rows[2, 3], rows[2, 9] = 10.0, 10.0 + 1e-12
    chosen = chooser.choose(rows, list(range(6)))
    assert chosen == rows.argmax(dim=-1).tolist()
    assert chosen[1] == 7
    assert chosen[2] == (9 if dtype == torch.float64 else 3)  # 10 + 1e-12 rounds to 10 below float64
