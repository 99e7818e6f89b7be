"""The final hidden states the engine reports to sources that want them (engine/sources.WantsStates): one
for every token it caches (the prompt's at the prefill, each step's root and matched nodes), each the
state a plain forward pass over the whole text computes at that position (float64)."""

from __future__ import annotations

import pytest
import torch

import lookahead
from lookahead import LookaheadConfig
from lookahead.candidates.suffix import SuffixSource
from lookahead.config import GenerationConfig, SamplingConfig
from lookahead.errors import ConfigError
from lookahead.engine.model_runner import final_norm
from lookahead.scheduler.request import Request
from lookahead.scheduler.scheduler import Scheduler, SchedulerConfig

from ..scheduler.helpers import drain
from .helpers import model64, prompts


def reference_states(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """[len(ids), D]: the final norm's output over `ids` in one plain causal pass."""
    kept: list[torch.Tensor] = []
    handle = final_norm(model).register_forward_hook(lambda m, i, out: kept.append(out))  # type: ignore[union-attr]
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]))
    finally:
        handle.remove()
    return kept[-1][0]


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma3"])
def test_every_cached_token_reports_the_state_a_plain_pass_computes(arch: str) -> None:
    lm = model64(arch)
    # Two requests in one batch (slots 0 and 1), greedy and seeded-sampled, whose steps verify the suffix
    # source's guesses (and match nodes).
    la = LookaheadConfig(sources=("suffix",), hidden_states=True)
    cfgs = [GenerationConfig(max_new_tokens=24, lookahead=la),
            GenerationConfig(max_new_tokens=24, lookahead=la, sampling=SamplingConfig(temperature=0.9, seed=3))]
    texts = prompts(4)[2:4]
    scheduler = Scheduler(lm, SchedulerConfig(max_batch=2))
    requests = [Request(lm, lm.encode(t, raw=True), c) for t, c in zip(texts, cfgs)]
    for r in requests:
        scheduler.add(r)
    done = drain(scheduler)
    speculated = 0
    for r in requests:
        assert r.states, "the pool must ask for states when a source wants them"
        src = next(s for s in r.proposer.sources if isinstance(s, SuffixSource))._hidden  # type: ignore[attr-defined]
        text = r.prompt_ids + done[id(r)]
        # Known: a prefix of the text, past the prompt, short of its end: the sources hear of every step but
        # the last (a finished request learns nothing more), and the last token was never fed.
        m = int(src._known.sum())
        assert src._known[:m].all(), f"{arch}: positions without a state: {(~src._known[:m]).nonzero()}"
        assert len(r.prompt_ids) - 1 < m <= len(text) - 2
        ref = torch.nn.functional.normalize(reference_states(lm.model, text[:m]).float(), dim=-1)
        assert torch.allclose(torch.from_numpy(src._unit[:m]), ref, atol=1e-5), arch
        speculated += r.stats.tokens_per_step > 1.0
    assert speculated, "no request accepted a guess: the steps never matched a node"


def test_states_are_asked_for_only_where_a_source_wants_them() -> None:
    lm = model64("llama")

    def asks(**kw: object) -> bool:
        return Request(lm, lm.encode("abcabc", raw=True), GenerationConfig(max_new_tokens=4, **kw)).states  # type: ignore[arg-type]

    assert asks(lookahead=LookaheadConfig(hidden_states=True))
    assert not asks()  # off by default
    assert not asks(lookahead=LookaheadConfig(sources=("recycle", "resume"), hidden_states=True))  # no taker
    assert not asks(strategy="autoregressive", lookahead=LookaheadConfig(hidden_states=True))


def test_hidden_states_must_be_a_bool() -> None:
    with pytest.raises(ConfigError, match="hidden_states"):
        LookaheadConfig(hidden_states="yes")  # type: ignore[arg-type]


def test_no_hook_outlives_a_request() -> None:
    # The states are read by a hook on the final norm for the passes that ask only: requests (each with
    # runners of its own) must not pile hooks onto the shared model.
    lm = model64("llama")
    for _ in range(2):
        lookahead.generate(lm, lm.encode("abcabcabc", raw=True), max_new_tokens=6,
                           lookahead=LookaheadConfig(sources=("suffix",), hidden_states=True))
    assert not final_norm(lm.model)._forward_hooks  # type: ignore[union-attr]
