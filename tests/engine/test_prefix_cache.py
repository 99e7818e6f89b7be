"""The prefix cache (engine/prefix_cache.py): which stored prefix a prompt reuses, what the cache keeps and
evicts, the kernel rows after a reused prefix, the device check that gates reuse, and decoding with
reused prefixes against decoding without (tokens must be identical)."""

from __future__ import annotations

import pytest
import torch

from lookahead import generate
from lookahead.config import GenerationConfig, LookaheadConfig, SamplingConfig
from lookahead.engine import exact_kernel
from lookahead.engine.kvcache import KVCache
from lookahead.engine.model_runner import ModelRunner
from lookahead.engine.prefix_cache import PrefixCache, split_exact
from lookahead.errors import ConfigError
from lookahead.scheduler.request import Request
from lookahead.scheduler.scheduler import Scheduler, SchedulerConfig
from lookahead.testing import ARCHS, tiny_model

LAYERS, HEADS, DIM = 2, 2, 4
BYTES_PER_TOKEN = LAYERS * 2 * HEADS * DIM * 4  # float32 keys and values of one token


def _slot(tokens: list[int]) -> KVCache:
    """A one-slot cache holding, for token i, keys and values that encode (layer, token id, position)."""
    cache = KVCache(1, 1)
    cache.select(0, 1)
    kv = []
    for layer in range(LAYERS):
        ids = torch.tensor(tokens, dtype=torch.float32)
        k = (1000 * layer + ids)[None, :, None].expand(HEADS, -1, DIM).clone()  # [H, n, D]
        v = -k + torch.arange(len(tokens), dtype=torch.float32)[None, :, None] / 1000
        kv.append((k, v))
    cache.load(0, kv)
    return cache


def _store(pc: PrefixCache, tokens: list[int]) -> None:
    pc.store(tokens, _slot(tokens), 0)


A = list(range(100, 140))  # 40 tokens: blocks of 16 are A[:16], A[16:32]; A[32:] is a partial block


def test_the_longest_stored_whole_block_prefix_is_reused() -> None:
    pc = PrefixCache(1 << 20, block=16)
    _store(pc, A)  # keeps A[:32] (the partial block A[32:40] is not kept)
    # A rest shorter than `least` is not allowed (a padded pass): one block less, or the whole prompt.
    assert pc.match(A[:35], least=4)[0] == 16 and pc.match(A[:36], least=4)[0] == 32
    assert pc.match(A[:32], least=4)[0] == 32
    # Same first 35 tokens, then another: both whole blocks match.
    n, kv = pc.match(A[:35] + [7])
    assert n == 32
    want = _slot(A).prefix(0, 32)
    assert all(torch.equal(a, b) for (k, v), (wk, wv) in zip(kv, want) for a, b in ((k, wk), (v, wv)))
    # Differs at token 20 (inside the second block): only the first block matches.
    assert pc.match(A[:20] + [7] * 20)[0] == 16
    # Differs at token 0, or shorter than one block: nothing.
    assert pc.match([7] + A[1:])[0] == 0
    assert pc.match(A[:15])[0] == 0
    # The stored part exactly (32 tokens): all of it.
    assert pc.match(A[:32])[0] == 32
    assert pc.stats()["hits"] == 6 and pc.stats()["lookups"] == 8 and pc.stats()["reused_tokens"] == 16 + 32 + 32 + 32 + 16 + 32


def test_a_second_prompt_with_the_same_head_is_kept_too_and_answers_for_the_head() -> None:
    pc = PrefixCache(1 << 20, block=16)
    _store(pc, A)
    B = A[:16] + [9] * 20  # shares A's first block only
    _store(pc, B)
    assert pc.stats()["entries"] == 2
    assert pc.match(B + [1])[0] == 32  # B's own two blocks
    assert pc.match(A + [1])[0] == 32  # A's are still there
    assert pc.match(A[:16] + [5] * 20)[0] == 16  # the shared head, from either entry


def test_storing_a_prefix_already_kept_adds_nothing() -> None:
    pc = PrefixCache(1 << 20, block=16)
    _store(pc, A)
    before = pc.stats()["bytes"]
    _store(pc, A[:33])  # the same two whole blocks
    assert pc.stats()["bytes"] == before == 32 * BYTES_PER_TOKEN and pc.stats()["entries"] == 1


def test_least_recently_used_entries_go_first_when_full() -> None:
    one = 16 * BYTES_PER_TOKEN  # an entry of one block
    pc = PrefixCache(2 * one, block=16)
    p1, p2, p3 = [1] * 16, [2] * 16, [3] * 16
    _store(pc, p1)
    _store(pc, p2)
    assert pc.match(p1 + [0])[0] == 16  # p1 used: p2 is now the least recently used
    _store(pc, p3)  # over budget: p2 goes
    assert pc.stats()["entries"] == 2 and pc.stats()["bytes"] == 2 * one
    assert pc.match(p2 + [0])[0] == 0
    assert pc.match(p1 + [0])[0] == 16 and pc.match(p3 + [0])[0] == 16


def test_an_entry_larger_than_the_budget_and_a_zero_budget_keep_nothing() -> None:
    small = PrefixCache(16 * BYTES_PER_TOKEN - 1, block=16)
    _store(small, A)
    assert small.stats()["entries"] == 0 and small.match(A)[0] == 0
    off = PrefixCache(0)
    _store(off, A)
    assert off.stats() == {"entries": 0, "bytes": 0, "lookups": 0, "hits": 0, "reused_tokens": 0}
    assert off.match(A) == (0, [])


@pytest.mark.parametrize("kwargs", [{"max_bytes": -1}, {"max_bytes": True}, {"max_bytes": 1.5},
                                    {"block": 12}, {"block": 0}, {"block": True}])
def test_settings_are_checked(kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        PrefixCache(**kwargs)


@pytest.mark.parametrize("past, n, window", [(16, 40, 0), (128, 130, 0), (8, 7, 0), (160, 50, 32), (5, 20, 0)])
def test_kernel_rows_after_cached_keys_have_the_one_pass_bits(past: int, n: int, window: int) -> None:
    # Rows past..past+n-1 computed after `past` cached keys equal the same rows of one pass over the whole
    # prompt, bit for bit: every row sums over the same absolute key chunks (prefill_kernel.cpp). (past=5:
    # not a multiple of 8, still exact without a window: the tile grid matters only under one.)
    gen = torch.Generator().manual_seed(past + n)
    heads, kv_heads, d = 6, 2, 64
    q = torch.randn(1, heads, past + n, d, generator=gen).bfloat16()
    k = torch.randn(1, kv_heads, past + n, d, generator=gen).bfloat16()
    v = torch.randn(1, kv_heads, past + n, d, generator=gen).bfloat16()
    module = exact_kernel.kernel()
    assert module is not None, f"the engine's C++ extension did not build here: {exact_kernel.status()}"
    if not module.prefill_supported():  # no AVX-512 BF16: the kernel refuses; prompts keep SDPA
        with pytest.raises(RuntimeError, match="AVX-512 BF16"):
            module.causal_prefill(q, k, v, d ** -0.5, window, past)
        return
    whole = module.causal_prefill(q, k, v, d ** -0.5, window, 0)  # [1, past + n, H, D]
    tail = module.causal_prefill(q[:, :, past:].contiguous(), k, v, d ** -0.5, window, past)  # [1, n, H, D]
    assert torch.equal(tail, whole[:, past:])
    with pytest.raises(RuntimeError, match="keys do not match"):  # fewer keys than past + n
        module.causal_prefill(q[:, :, past:].contiguous(), k[:, :, : past + n - 1], v[:, :, : past + n - 1],
                              d ** -0.5, window, past)


def test_the_device_check_passes_a_split_exact_prefill_and_fails_a_perturbed_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    lm = tiny_model("gemma3", dtype=torch.bfloat16)  # sliding windows of 8: the probe's prompt runs past them
    runner = ModelRunner(lm.model)
    vocab = lm.model.get_output_embeddings().weight.shape[0]
    assert split_exact(runner, lambda: KVCache(1, 1), vocab, 16, 8)
    real = ModelRunner.prefill

    def drifting(self, cache, tokens, states=False, continued=False):  # a prefill whose split changes a bit
        out = real(self, cache, tokens, states, continued)
        if continued:
            cache.layers[-1]._k[0, 0, cache.get_seq_length() - 1, 0] += 1
        return out

    monkeypatch.setattr(ModelRunner, "prefill", drifting)
    assert not split_exact(runner, lambda: KVCache(1, 1), vocab, 16, 8)


def _prompts() -> list[str]:
    head = "System: answer in one short line, using the tools listed.\nTools: add(a, b), mul(a, b), neg(a).\n"
    return [head + "User: add 2 and 3", head + "User: what is 7 times 6?", head + "User: add 2 and 3",
            head[:50] + "something else entirely, not the same tools"]


@pytest.mark.parametrize("arch", ARCHS)
def test_decoding_after_a_reused_prefix_gives_the_same_tokens(arch: str) -> None:
    # bfloat16 tiny models: the prefill runs lookahead's kernel, whose split is exact by construction, and the
    # device check must agree (else no prefix would be reused and the counts below would be 0).
    lm = tiny_model(arch, dtype=torch.bfloat16)
    runs = [("autoregressive", None), ("lookahead", None), ("prompt_lookup", None),
            ("lookahead", SamplingConfig(temperature=0.8, top_k=20, seed=3))]
    want = {(p, s, str(c)): generate(lm, p, raw=True, max_new_tokens=20, strategy=s, sampling=c, prefix_cache=False)
            for p in _prompts() for s, c in runs}
    pc = PrefixCache(block=16)
    cached = []
    for p in _prompts():
        for s, c in runs:
            got = generate(lm, p, raw=True, max_new_tokens=20, strategy=s, sampling=c, prefix_cache=pc,
                           lookahead=LookaheadConfig())
            assert got.token_ids == want[(p, s, str(c))].token_ids, (arch, p, s, c)
            cached.append(got.stats.cached_tokens)
    # The reference: the longest whole-block common prefix with any prompt prefilled before (each stored as
    # its whole blocks), over the tokens each run prefills (all but the last).
    done: list[list[int]] = []
    expected = []
    for p in _prompts():
        ids = lm.encode(p, raw=True)[:-1]
        for _ in runs:
            common = [next((i for i, (a, b) in enumerate(zip(ids, d)) if a != b), min(len(ids), len(d))) for d in done]
            expected.append(max(common, default=0) // 16 * 16)
            done.append(ids)
    assert cached == expected
    assert expected[0] == 0 and min(expected[1:]) >= 48  # every prompt reuses something after the first run
    assert pc.stats()["entries"] == 3  # the third prompt is the first one again


def test_a_batched_scheduler_reuses_prefixes_in_any_slot() -> None:
    lm = tiny_model("llama", dtype=torch.bfloat16)
    prompts = [lm.encode(p, raw=True) for p in _prompts()[:2]]
    alone = [generate(lm, p, raw=True, max_new_tokens=16, prefix_cache=False).token_ids for p in _prompts()[:2]]
    pc = PrefixCache(block=16)
    sched = Scheduler(lm, SchedulerConfig(max_batch=2), pc)
    requests = [Request(lm, ids, GenerationConfig(max_new_tokens=16)) for ids in prompts]
    for r in requests:
        sched.add(r)  # the second goes to slot 1, after the first's prompt was stored
    results = {}
    while sched.active:
        for request, event in sched.step():
            if event.result is not None:
                results[requests.index(request)] = event.result
    assert [results[i].token_ids for i in range(2)] == alone
    assert results[0].stats.cached_tokens == 0 and results[1].stats.cached_tokens >= 64


def test_nothing_is_reused_where_the_split_is_not_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    lm = tiny_model("qwen2", dtype=torch.bfloat16)
    # a fresh model: no check cached for it in this process, so the scheduler asks this one
    monkeypatch.setattr("lookahead.scheduler.scheduler.split_exact", lambda *a, **k: False)
    pc = PrefixCache(block=16)
    first, second = [generate(lm, _prompts()[i], raw=True, max_new_tokens=8, prefix_cache=pc) for i in (0, 2)]
    assert first.stats.cached_tokens == second.stats.cached_tokens == 0
    assert pc.stats()["lookups"] == 0 and pc.stats()["entries"] == 0
    with pytest.raises(ConfigError, match="prefix_cache"):
        generate(lm, "x", raw=True, max_new_tokens=2, prefix_cache="yes")  # type: ignore[arg-type]


def test_a_cache_serves_one_model() -> None:
    # keys are token ids only: a cache filled by one model must not hand its tensors to another
    a, b = tiny_model("llama", dtype=torch.bfloat16, seed=0), tiny_model("llama", dtype=torch.bfloat16, seed=1)
    pc = PrefixCache(block=16)
    generate(a, _prompts()[0], raw=True, max_new_tokens=2, prefix_cache=pc)
    with pytest.raises(ConfigError, match="another model"):
        generate(b, _prompts()[0], raw=True, max_new_tokens=2, prefix_cache=pc)
    assert generate(a, _prompts()[0], raw=True, max_new_tokens=2, prefix_cache=pc).stats.cached_tokens > 0


def test_the_rest_of_a_prompt_is_never_shorter_than_the_width_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    # A pass narrower than the model's width floor is padded with dummy rows, which takes it off the causal
    # kernel (other bits): where a stored prefix would leave fewer tokens than the floor, a block less is used.
    lm = tiny_model("llama", dtype=torch.bfloat16)
    monkeypatch.setattr(ModelRunner, "row_floor", lambda self, batch: 6)
    pc = PrefixCache(block=16)
    head = "0123456789abcdef" * 3  # 48 bytes: with the BOS token, the prefilled tokens are 48 + rest
    ids = lm.encode(head, raw=True)
    first = generate(lm, ids + [1] * 20, max_new_tokens=2, prefix_cache=pc)  # stores 64 of its 68 prefilled tokens
    assert first.stats.cached_tokens == 0
    # 48 + 5 prefilled: 48 stored tokens would leave 5 < 6, so 32 are used (a rest of 21)
    got = generate(lm, ids[:48] + [2] * 5 + [3], max_new_tokens=2, prefix_cache=pc)
    assert got.stats.cached_tokens == 32
    # 48 + 6 prefilled: the rest is the floor's 6 rows, so all 48 are used
    assert generate(lm, ids[:48] + [2] * 6 + [3], max_new_tokens=2, prefix_cache=pc).stats.cached_tokens == 48
