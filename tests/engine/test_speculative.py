"""Speculative decoding: the draft's tokenizer check, the self-draft wrapper, the draft cache rollback."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

import lookahead
from lookahead import GenerationConfig, SamplingConfig
from lookahead.candidates.speculative import SpeculativeProposer
from lookahead.config import GREEDY, SpeculativeConfig
from lookahead.engine.kvcache import KVCache
from lookahead.engine.sampling import TokenChooser
from lookahead.engine.model_runner import ModelRunner
from lookahead.engine.step import StepRunner
from lookahead.errors import ConfigError
from lookahead.models import wrap
from lookahead.models.drafts import check_same_tokenizer
from lookahead.models.self_draft import SUPPORTED, SelfDraft
from lookahead.testing import byte_tokenizer, tiny_model

from .helpers import model64


def _other_tokenizer(kind: str):
    tok = byte_tokenizer()
    if kind == "extra-token":
        tok.add_special_tokens({"additional_special_tokens": ["<|tool|>"]})  # one more id than the target
    else:  # same vocabulary, different pre-tokenizer: every text gets a leading-space token
        from tokenizers import pre_tokenizers

        tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=False)
    return tok


@pytest.mark.parametrize("kind, needle", [("extra-token", "does not share the tokenizer"), ("prefix-space", "encodes")])
def test_draft_with_another_tokenizer_is_refused(kind: str, needle: str) -> None:
    target = model64("llama")
    other = tiny_model("llama", dtype=torch.float64, seed=1)
    bad = wrap(other.model, _other_tokenizer(kind), name="other-draft")
    with pytest.raises(ConfigError, match=needle) as err:
        lookahead.generate(target, "hello", max_new_tokens=4, strategy="speculative", draft=bad)
    assert "other-draft" in str(err.value) and "--draft self:L" in str(err.value)
    check_same_tokenizer(target, other)  # the same tokenizer passes


def test_draft_loaded_by_path_is_checked(tmp_path: Path) -> None:
    other = tiny_model("qwen2", dtype=torch.float64, seed=1)
    other.model.save_pretrained(tmp_path / "draft")
    _other_tokenizer("extra-token").save_pretrained(tmp_path / "draft")
    target = model64("qwen2")
    with pytest.raises(ConfigError, match="does not share the tokenizer"):
        lookahead.generate(target, "hi", max_new_tokens=4, strategy="speculative",
                           speculative=SpeculativeConfig(draft=str(tmp_path / "draft")))


@pytest.mark.parametrize("arch", ["gpt2", "gemma3"])
def test_self_draft_of_an_unsupported_arch_says_what_to_do(arch: str) -> None:
    with pytest.raises(ConfigError, match="self-drafting supports llama-like.*--draft MODEL"):
        lookahead.generate(model64(arch), "hi", max_new_tokens=4, strategy="speculative")


def test_self_draft_layer_count_and_config_are_validated() -> None:
    with pytest.raises(ConfigError, match="target has 2"):
        lookahead.generate(model64("llama"), "hi", max_new_tokens=4, strategy="speculative",
                           speculative=SpeculativeConfig("self:3"))
    for draft in ("self:0", "self:x", "self:-1", " "):
        with pytest.raises(ConfigError, match="self:L|draft must be"):
            SpeculativeConfig(draft)
    with pytest.raises(ConfigError, match="draft_tokens"):
        SpeculativeConfig(draft_tokens=0)
    with pytest.raises(ConfigError, match="unknown strategy"):
        GenerationConfig(strategy="medusa")


@pytest.mark.parametrize("arch", SUPPORTED)
def test_self_draft_with_every_layer_is_the_target(arch: str) -> None:
    # The wrapper runs the layers the way the model's own forward does: with all of them, same logits.
    lm = model64(arch)
    full = SelfDraft(lm.model, lm.model.config.num_hidden_layers)
    # No copies: every weight and buffer of the wrapper lives in the target's own storage.
    target = {t.untyped_storage().data_ptr() for t in [*lm.model.parameters(), *lm.model.buffers()]}
    shared = [t.untyped_storage().data_ptr() in target for t in [*full.parameters(), *full.buffers()]]
    assert shared and all(shared)
    ids = torch.tensor(lm.encode("the quick brown fox", raw=True))
    chooser = TokenChooser(GREEDY, lm.model.get_output_embeddings().weight.shape[0])
    n = ids.numel()
    causal = torch.ones(n, n, dtype=torch.bool).tril_()
    mine = ModelRunner(full).forward(KVCache(), ids, torch.arange(n), causal, keep=torch.arange(n))
    with torch.no_grad():
        ref = lm.model(ids[None]).logits[0]
    torch.testing.assert_close(mine, ref)
    # and the first layer alone is a different (cheaper) model
    one = ModelRunner(SelfDraft(lm.model, 1)).forward(KVCache(), ids, torch.arange(n), causal, keep=torch.arange(n))
    assert not torch.allclose(one, ref)


def test_draft_cache_is_rolled_back_to_the_accepted_length() -> None:
    # Drive the step loop by hand: after every step the draft's incremental proposal must equal a
    # proposal from scratch (a stale or missing cache entry would change it), and its cache must hold
    # the context but the last one or two tokens.
    lm = dataclasses.replace(model64("llama"), eos_token_ids=())
    sampling = SamplingConfig(temperature=1.0, seed=0)  # (the self-draft agrees partly under sampling)
    chooser = TokenChooser(sampling, lm.model.get_output_embeddings().weight.shape[0])
    runner, cache = StepRunner(lm.model, chooser), KVCache()
    k = 3
    proposer = SpeculativeProposer(SelfDraft(lm.model, 1), k, chooser)
    context = lm.encode("abcabcabc tick tock tick", raw=True)
    runner.prefill(cache, context)
    matched_counts = set()
    for _ in range(25):
        draft = proposer.propose(context, k)
        fresh = SpeculativeProposer(SelfDraft(lm.model, 1), k, chooser).propose(context, k)
        assert draft.tree.tokens == fresh.tree.tokens
        outcome = runner.step(cache, context[-1], draft)
        context = context + outcome.accepted
        proposer.update(context, outcome)
        matched = len(outcome.accepted) - 1
        matched_counts.add(matched)
        held = proposer.cache.get_seq_length()
        assert held == len(context) - (2 if matched == k else 1)
    assert matched_counts & {1, 2}, matched_counts  # partial acceptances happened: the crop was exercised


@pytest.mark.parametrize("spread", [0.3, 1.0, 2.5])
def test_shared_noise_acceptance_is_between_the_gumbel_bound_and_the_optimum(spread: float) -> None:
    # The note in docs/strategies.md: a draft token (argmax of log q + g) equals the target's (argmax of
    # log p + g) with probability at least (1 - d) / (1 + d), d = TV(p, q); no coupling beats 1 - d
    # (classic speculative sampling's acceptance rate).
    gen = torch.Generator().manual_seed(int(spread * 10))
    logp = torch.randn(12, generator=gen, dtype=torch.float64)
    logq = logp + spread * torch.randn(12, generator=gen, dtype=torch.float64)
    d = 0.5 * (logp.softmax(-1) - logq.softmax(-1)).abs().sum().item()
    chooser = TokenChooser(SamplingConfig(temperature=1.0, seed=3), vocab_size=12)
    n = 3000
    same = sum(chooser.choose(logp[None], [t]) == chooser.choose(logq[None], [t]) for t in range(n)) / n
    assert (1 - d) / (1 + d) - 0.03 < same < (1 - d) + 0.03, (d, same)
