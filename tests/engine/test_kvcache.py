"""KV-cache compaction checked directly against the cache autoregressive decoding builds."""

from __future__ import annotations

import pytest
import torch

from lookahead import LookaheadConfig
from lookahead.candidates.context import ContextSource
from lookahead.candidates.lookahead import JacobiSource
from lookahead.candidates.pool import PoolConfig, SourcePool
from lookahead.engine.calibration import Calibrator
from lookahead.engine.draft import CandidateTree, Draft
from lookahead.config import GREEDY
from lookahead.engine.kvcache import KVCache
from lookahead.engine.sampling import TokenChooser
from lookahead.engine.step import StepItem, StepRunner

from .helpers import model64


def test_cache_after_lookahead_steps_equals_autoregressive_cache() -> None:
    for arch in ("llama", "gemma3", "gpt2"):
        lm = model64(arch)
        prompt = lm.encode("abcabcabcabcabcabc", raw=True)
        runner = StepRunner(lm.model, TokenChooser(GREEDY, lm.model.config.vocab_size))
        lk = LookaheadConfig(3, 4, 4)
        sources = [ContextSource(prompt), JacobiSource(lk.window, lk.ngram, prompt)]
        proposer = SourcePool(sources, PoolConfig(max_tokens=lk.candidate_tokens, per_source=4), Calibrator())
        cache = KVCache()
        runner.prefill(cache, prompt)
        context = list(prompt)
        multi = 0
        for _ in range(8):
            outcome = runner.step(cache, context[-1], proposer.propose(context, budget=100))
            context.extend(outcome.accepted)
            proposer.update(context, outcome)
            multi += len(outcome.accepted) > 1
            # the cache holds exactly the accepted tokens but the newest (the next root)
            assert cache.get_seq_length() == len(context) - 1
            reference = KVCache()
            runner.prefill(reference, context)  # caches context[:-1] in one plain causal pass
            for mine, ref in zip(cache.layers, reference.layers):
                torch.testing.assert_close(mine.keys, ref.keys, rtol=1e-9, atol=1e-9)
                torch.testing.assert_close(mine.values, ref.values, rtol=1e-9, atol=1e-9)
        assert multi > 0, f"{arch}: no step accepted a guess, so compaction was not exercised"


def test_growable_layer_keep_and_crop() -> None:
    cache = KVCache()
    k = torch.arange(2 * 3 * 6 * 4, dtype=torch.float64).reshape(2, 3, 6, 4)
    cache.update(k, k + 1000, 0)
    cache.update(k[:, :, :4] + 5000, k[:, :, :4] + 6000, 0)  # 4 new entries after a prefix of 6
    cache.keep(6, torch.tensor([0, 2]))
    layer = cache.layers[0]
    assert layer.keys.shape[-2] == 8
    torch.testing.assert_close(layer.keys[:, :, :6], k)
    torch.testing.assert_close(layer.keys[:, :, 6], k[:, :, 0] + 5000)
    torch.testing.assert_close(layer.keys[:, :, 7], k[:, :, 2] + 5000)
    torch.testing.assert_close(layer.values[:, :, 7], k[:, :, 2] + 6000)
    cache.crop(-3)
    assert cache.get_seq_length() == 5


def test_placed_entries_land_at_their_offsets_and_compact_back() -> None:
    # A pass of 3 entries placed at offsets [0, 1, 4] after a prefix of 6 (engine/query.py align_tree):
    # the slot then spans 6 + 5 keys (slots 8, 9 untouched: zeros), padded to the key alignment of 4;
    # keeping offsets [0, 4] (the root and a branch node) moves the branch node's entry right after the root.
    cache = KVCache(key_align=4)
    k = torch.arange(1 * 2 * 6 * 3, dtype=torch.float64).reshape(1, 2, 6, 3)
    cache.update(k, k + 1000, 0)
    new = torch.arange(1 * 2 * 3 * 3, dtype=torch.float64).reshape(1, 2, 3, 3) + 5000
    cache.place([torch.tensor([0, 1, 4])])
    keys, values = cache.update(new, new + 1000, 0)
    cache.place(None)
    layer = cache.layers[0]
    assert cache.get_seq_length() == 11 and keys.shape[-2] == 12  # 11 padded to a multiple of 4
    torch.testing.assert_close(keys[:, :, 6:8], new[:, :, :2])
    torch.testing.assert_close(keys[:, :, 10], new[:, :, 2])
    torch.testing.assert_close(values[:, :, 10], new[:, :, 2] + 1000)
    assert bool((keys[:, :, 8:10] == 0).all())
    cache.keep(6, torch.tensor([0, 4]))
    assert cache.get_seq_length() == 8
    torch.testing.assert_close(layer.keys[:, :, 6], new[:, :, 0])
    torch.testing.assert_close(layer.keys[:, :, 7], new[:, :, 2])
    torch.testing.assert_close(layer.values[:, :, 7], new[:, :, 2] + 1000)
    # in order again after place(None)
    cache.update(new[:, :, :1] + 1, new[:, :, :1] + 1, 0)
    torch.testing.assert_close(layer.keys[:, :, 8], new[:, :, 0] + 1)


def test_key_width_counts_each_slots_own_span() -> None:
    # Two slots of lengths 6 and 2; the next pass writes 2 entries to each, slot 0 in order (span 2),
    # slot 1 at offsets [0, 9] (span 10). The model then sees max(6 + 2, 2 + 10) = 12 keys, not the
    # longest length plus the largest span (16): the masks must be exactly as wide as the keys.
    cache = KVCache()
    k = torch.zeros(2, 1, 6, 2, dtype=torch.float64)
    cache.update(k, k, 0)
    cache.keep(0, torch.arange(2), slot=1)
    assert cache.slot_lengths() == [6, 2]
    assert cache.key_width(2) == 8
    assert cache.key_width([2, 10]) == 12
    cache.place([torch.tensor([0, 1]), torch.tensor([0, 9])])
    keys, _ = cache.update(k[:, :, :2], k[:, :, :2], 0)
    cache.place(None)
    assert keys.shape[-2] == 12 and cache.slot_lengths() == [8, 12]


def test_a_step_reports_each_computed_rows_predecessor_for_recycling() -> None:
    # Root r (after a, b) with the tree r -> x -> y and r -> z, and a Jacobi window: the rows are
    # [r, x, y, z, aux...]; the last two tokens before each on its own path: (a, b) before r, (b, r)
    # before x and z, (r, x) before y; aux rows are on no path (). One entry per successors row.
    lm = model64("llama")
    prompt = lm.encode("abcabcabc", raw=True)
    runner = StepRunner(lm.model, TokenChooser(GREEDY, lm.model.config.vocab_size))
    cache = KVCache()
    runner.prefill(cache, prompt)
    a, b, r, x, y, z = prompt[-3], prompt[-2], prompt[-1], 5, 6, 7
    tree = CandidateTree()
    tree.add([x, y])
    tree.add([z])
    aux = JacobiSource(2, 3, prompt).branch()
    item = StepItem(r, Draft(tree=tree, aux=aux), runner.chooser, top_k=3, history=(9, a, b))  # type: ignore[arg-type]
    outcome = runner.step_batch(cache, [item])[0]
    rows = [token for token, _ in outcome.successors]
    assert rows[:4] == [r, x, y, z] and len(rows) > 4  # the aux out rows come last
    assert outcome.predecessors == [(a, b), (b, r), (r, x), (b, r)] + [()] * (len(rows) - 4)
    assert all(len(top) == 3 for _, top in outcome.successors)


def test_compaction_in_one_kernel_call_equals_the_per_layer_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    # KVCache.keep moves every layer's kept entries in one call when lookahead's extension is loaded
    # (engine/lean_kernel.cpp keep_rows_), else with PyTorch per layer. Both must leave the same buffers:
    # three layers, three slots of which the last two are selected, bfloat16 and float64, kept rows out of
    # order and in order but not in place.
    from lookahead.engine import exact_kernel

    assert exact_kernel.kernel() is not None, exact_kernel.status()
    for dtype in (torch.bfloat16, torch.float64):
        caches = []
        for loaded in (True, False):
            monkeypatch.setattr(exact_kernel, "loaded", (lambda: exact_kernel.kernel()) if loaded else (lambda: None))
            cache = KVCache(slots=3)
            cache.select(0, 3)
            for layer in range(3):  # a 9-entry prompt in each slot, then a 6-entry step in slots 1 and 2
                k = torch.randn(3, 2, 9, 4, generator=torch.Generator().manual_seed(layer)).to(dtype)
                cache.update(k, -k, layer)
            cache.select(1, 3)
            for layer in range(3):
                k = torch.randn(2, 2, 6, 4, generator=torch.Generator().manual_seed(10 + layer)).to(dtype)
                cache.update(k, 2 * k, layer)
            cache.keep(9, torch.tensor([4, 0, 2]))  # both selected slots
            cache.keep(12, torch.tensor([1]), slot=2)  # one slot, one entry moved down
            caches.append(cache)
        fast, slow = caches
        assert fast.slot_lengths() == slow.slot_lengths() == [12, 13] and fast.get_seq_length() == 13
        for a, b in zip(fast.layers, slow.layers):
            assert torch.equal(a._k, b._k) and torch.equal(a._v, b._v)
            assert torch.equal(a.keys, b.keys) and a.keys.shape[-2] == 13
