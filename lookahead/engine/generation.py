"""The generation loop shared by every strategy, as a generator of accepted runs.

    1. encode and validate the request
    2. prefill the prompt into the KV cache
    3. repeat: propose -> one step (forward, verify, compact KV) -> apply stop rules -> emit -> update
    4. report the result and its statistics
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field

from lookahead.candidates.ngram_cache import NGramCache
from lookahead.config import GREEDY, GenerationConfig, LookaheadConfig, PromptLookupConfig, SamplingConfig, SpeculativeConfig
from lookahead.engine.draft import Draft, Proposer, ReportsDraftCost
from lookahead.engine.gate import GateConfig
from lookahead.engine.kvcache import KVCache
from lookahead.engine.numerics import width_probe
from lookahead.engine.sampling import TokenChooser
from lookahead.engine.step import StepRunner
from lookahead.engine.stopping import StopState
from lookahead.engine.strategies import ProposerInputs, make_proposer
from lookahead.errors import PromptError
from lookahead.models.loader import LoadedModel, PromptLike


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    steps: int = 0
    tokens_per_step: float = 0.0
    guesses_verified: int = 0  # candidate tokens fed to the verification branch
    guesses_accepted: int = 0  # of those, tokens the model confirmed (and that were emitted)
    acceptance_rate: float = 0.0
    processed_tokens: int = 0  # query tokens summed over decode steps: the compute spent
    prefill_s: float = 0.0
    decode_s: float = 0.0
    total_s: float = 0.0
    ttft_s: float = 0.0
    tokens_per_s: float = 0.0  # decode tokens per second
    device_s: float = 0.0  # time inside the model's forward passes (prefill and draft model included)
    draft_steps: int = 0  # forward passes of a draft model (speculative; its prefill included)
    draft_s: float = 0.0  # time inside them (part of device_s and decode_s)
    accepted_by_source: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" (EOS or stop string) or "length"
    strategy: str
    stats: GenerationStats
    dtype: str = "float32"  # the weights' dtype that ran
    width_floor: int | None = None  # every pass was padded to this many rows (None: unpadded)

    def to_dict(self) -> dict[str, object]:
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "strategy": self.strategy,
            "dtype": self.dtype,
            "width_floor": self.width_floor,
            "stats": self.stats.to_dict(),
        }


@dataclass
class StepEvent:
    """One accepted run: its new text (may be empty while a stop string could still match) and tokens.
    The last event carries the final result."""

    text: str
    token_ids: list[int]
    result: GenerationResult | None = None


def stream_events(
    loaded: LoadedModel,
    prompt: PromptLike,
    *,
    max_new_tokens: int = 256,
    strategy: str = "lookahead",
    lookahead: LookaheadConfig | None = None,
    sampling: SamplingConfig | None = None,
    stop: Sequence[str] = (),
    raw: bool = False,
    prompt_lookup: PromptLookupConfig | None = None,
    speculative: SpeculativeConfig | None = None,
    draft: LoadedModel | None = None,
    ngram_cache: NGramCache | None = None,
    adaptive: bool = True,
    exact: bool = True,
) -> Iterator[StepEvent]:
    """`draft`: a draft model for strategy "speculative" (else `speculative.draft` is resolved);
    `ngram_cache`: cross-request n-grams, offered to "lookahead"/"prompt_lookup" and updated with the
    finished response whatever the strategy. `exact`: pad every pass to the model's width floor where
    one exists (engine/numerics.py), so that every strategy's tokens are bit-identical to padded
    autoregressive decoding at any precision; False runs unpadded (the fastest plain path, identical
    to the others only up to float rounding)."""
    cfg = GenerationConfig(
        max_new_tokens=max_new_tokens,
        strategy=strategy,
        lookahead=lookahead or LookaheadConfig(),
        sampling=sampling or GREEDY,
        stop=tuple(stop),
        prompt_lookup=prompt_lookup or PromptLookupConfig(),
        speculative=speculative or SpeculativeConfig(),
        adaptive=adaptive,
        exact=exact,
    )
    # 1. Encode and validate.
    prompt_ids = loaded.encode(prompt, raw=raw)
    if len(prompt_ids) + cfg.max_new_tokens > loaded.context_length:
        raise PromptError(
            f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({cfg.max_new_tokens}) exceeds the model's "
            f"context of {loaded.context_length} tokens; shorten the prompt or lower max_new_tokens"
        )
    vocab = loaded.model.get_output_embeddings().weight.shape[0]
    # A draft model's tokens are already paid for when the gate would see them: never gate those.
    gate = GateConfig(adaptive=cfg.adaptive and cfg.strategy != "speculative")
    numerics = width_probe(loaded.model, cfg.widest_step) if cfg.exact else None
    runner = StepRunner(loaded.model, TokenChooser(cfg.sampling, vocab), gate, numerics)
    proposer: Proposer = make_proposer(ProposerInputs(cfg, prompt_ids, loaded, runner.chooser, draft, ngram_cache))
    cache = runner.new_cache()
    state = StopState(loaded.tokenizer, loaded.eos_token_ids, cfg.max_new_tokens, cfg.stop)
    stats = GenerationStats(prompt_tokens=len(prompt_ids))
    by_source: Counter[str] = Counter()

    # 2. Prefill: cache all prompt tokens but the last, which is the first step's root.
    t0 = time.perf_counter()
    runner.prefill(cache, prompt_ids)
    t1 = time.perf_counter()
    stats.prefill_s = t1 - t0

    # 3. Decode: one forward pass per step, at least one token per step.
    context = list(prompt_ids)
    while state.finish_reason is None:
        budget = cfg.max_new_tokens - len(state.token_ids) - 1  # candidate tokens worth verifying
        draft = proposer.propose(context, budget)
        if draft.aux is not None and len(context) + int(draft.aux.offsets.max()) >= loaded.context_length:
            draft = Draft(tree=draft.tree)  # the window would run past the context: skip it this step
        outcome = runner.step(cache, context[-1], draft)
        stats.steps += 1
        stats.processed_tokens += outcome.query_tokens
        stats.guesses_verified += outcome.candidate_tokens
        emitted: list[int] = []
        for token, source in zip(outcome.accepted, outcome.accepted_sources):
            emitted.append(token)
            by_source[source] += 1
            if state.push(token):
                break
        context.extend(emitted)
        runner.chooser.forget_before(len(context))
        if stats.steps == 1:
            stats.ttft_s = time.perf_counter() - t0
        chunk = state.take_text()
        if chunk or emitted:
            yield StepEvent(text=chunk, token_ids=emitted)
        if state.finish_reason is None:
            proposer.update(context, outcome)

    # 4. Result.
    t2 = time.perf_counter()
    stats.new_tokens = len(state.token_ids)
    stats.decode_s = t2 - t1
    stats.total_s = t2 - t0
    if isinstance(proposer, ReportsDraftCost):
        stats.draft_steps, stats.draft_s = proposer.draft_cost()
    stats.device_s = runner.timer.seconds + stats.draft_s
    stats.tokens_per_step = stats.new_tokens / max(stats.steps, 1)
    stats.guesses_accepted = sum(n for s, n in by_source.items() if s != "model")
    stats.acceptance_rate = stats.guesses_accepted / stats.guesses_verified if stats.guesses_verified else 0.0
    stats.tokens_per_s = stats.new_tokens / stats.decode_s if stats.decode_s > 0 else 0.0
    stats.accepted_by_source = dict(by_source)
    if ngram_cache is not None:
        ngram_cache.add_response(prompt_ids, state.token_ids)
    result = GenerationResult(state.text, list(state.token_ids), state.finish_reason or "length", cfg.strategy, stats,
                              dtype=str(loaded.dtype).replace("torch.", ""), width_floor=runner.model.floor)
    yield StepEvent(text=state.take_text(), token_ids=[], result=result)


def generate(loaded: LoadedModel, prompt: PromptLike, **kwargs: object) -> GenerationResult:
    """Decode to the end and return the result. Same arguments as `stream_events`."""
    result = None
    for event in stream_events(loaded, prompt, **kwargs):  # type: ignore[arg-type]
        result = event.result
    assert result is not None
    return result


def stream(loaded: LoadedModel, prompt: PromptLike, **kwargs: object) -> Iterator[str]:
    """Yield text chunks as runs are accepted. Same arguments as `stream_events`."""
    for event in stream_events(loaded, prompt, **kwargs):  # type: ignore[arg-type]
        if event.text:
            yield event.text

