"""The generation loop shared by every strategy, as a generator of accepted runs.

    1. encode and validate the request
    2. prefill the prompt into the KV cache
    3. repeat: propose -> allocate -> one step (forward, verify, compact KV) -> stop rules -> emit -> update
    4. report the result and its statistics

It ties the engine (lookahead/engine: step, allocator, cost curve) to the candidate sources
(lookahead/candidates, by strategy name through candidates/registry.py); the engine imports neither.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field

from lookahead.candidates.ngram_cache import NGramCache
from lookahead.candidates.registry import ProposerInputs, make_proposer
from lookahead.config import GREEDY, GenerationConfig, LookaheadConfig, PromptLookupConfig, SamplingConfig, SpeculativeConfig
from lookahead.engine.allocator import allocate
from lookahead.engine.calibration import Calibrator
from lookahead.engine.costs import CostCurve, cost_curve
from lookahead.engine.draft import Draft, Proposer, ReportsDraftCost
from lookahead.engine.numerics import width_probe
from lookahead.engine.sampling import TokenChooser
from lookahead.engine.step import StepRunner
from lookahead.engine.stopping import StopState
from lookahead.errors import PromptError
from lookahead.models.dtypes import device_signature
from lookahead.models.registry import cache_root
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
    overhead_s: float = 0.0  # decode time outside the forward passes: proposing, allocating, verifying, masks
    speculative_steps: int = 0  # steps that verified at least one guess
    aux_steps: int = 0  # steps that ran an aux branch (the Jacobi window)
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
    calibrator: Calibrator | None = None,
) -> Iterator[StepEvent]:
    """`draft`: a draft model for strategy "speculative" (else `speculative.draft` is resolved);
    `ngram_cache`: cross-request n-grams, offered to "lookahead"/"prompt_lookup" and updated with the
    finished response whatever the strategy. `exact`: pad every pass to the model's width floor where
    one exists (engine/numerics.py), so that every strategy's tokens are bit-identical to padded
    autoregressive decoding at any precision; False runs unpadded (the fastest plain path, identical
    to the others only up to float rounding). `calibrator`: acceptance estimates shared by the requests of
    a class (engine/calibration.py; None: this request learns its own); `adaptive`: size each step with
    the allocator (engine/allocator.py; False: verify every draft as proposed)."""
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
    numerics = width_probe(loaded.model, cfg.widest_step) if cfg.exact else None
    runner = StepRunner(loaded.model, TokenChooser(cfg.sampling, vocab), numerics)
    proposer: Proposer = make_proposer(ProposerInputs(cfg, prompt_ids, loaded, runner.chooser, draft, ngram_cache,
                                                      calibrator))
    runner.top_k = getattr(proposer, "top_k", 0)  # sources that recycle the model's top-k predictions
    curve = device_costs(loaded, runner)
    runner.pad_to = lambda k: min(curve.pad_to(k), max(k, cfg.widest_step))  # rows up to a cheaper width are free
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
    forward_s = 0.0  # seconds inside the decode steps' forward passes
    while state.finish_reason is None:
        budget = cfg.max_new_tokens - len(state.token_ids) - 1  # candidate tokens worth verifying
        draft = proposer.propose(context, budget)
        if draft.aux is not None and len(context) + int(draft.aux.offsets.max()) >= loaded.context_length:
            draft = Draft(tree=draft.tree, calibrated=draft.calibrated)  # the window would run past the context
        if draft.calibrated:  # size the step: the subtree (and aux rows) worth their cost on this device
            plan = allocate(draft.tree, draft.tree.probs, curve, aux_rows=_rows(draft), aux_value=draft.aux_value,
                            chain_only=runner.chain_only, max_width=cfg.widest_step)
            draft = Draft(tree=draft.tree.subtree(plan.nodes), aux=draft.aux if plan.aux else None)
        outcome = runner.step(cache, context[-1], draft)
        curve.observe(outcome.query_tokens, outcome.forward_s)
        forward_s += outcome.forward_s
        stats.steps += 1
        stats.speculative_steps += outcome.candidate_tokens > 0
        stats.aux_steps += draft.aux is not None
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
    stats.overhead_s = max(stats.decode_s - forward_s - stats.draft_s, 0.0)
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


def device_costs(loaded: LoadedModel, runner: StepRunner, remeasure: bool = False) -> CostCurve:
    """The cost curve of `runner`'s passes on this device (engine/costs.py), cached per model, dtype,
    device and pass kind; `remeasure` re-times it and overwrites the cache (`lookahead profile`)."""
    return cost_curve(loaded.model, runner.model, cache_root() / "cost-curves.json",
                      f"{loaded.name}|{loaded.dtype}|{device_signature()}", remeasure=remeasure)


def engine_cost_curve(loaded: LoadedModel, exact: bool = True, remeasure: bool = False) -> CostCurve:
    """The curve the allocator reads for default generation settings (exact passes unless told)."""
    cfg = GenerationConfig(exact=exact)
    numerics = width_probe(loaded.model, cfg.widest_step) if exact else None
    vocab = loaded.model.get_output_embeddings().weight.shape[0]
    return device_costs(loaded, StepRunner(loaded.model, TokenChooser(cfg.sampling, vocab), numerics), remeasure)


def _rows(draft: Draft) -> int:
    return 0 if draft.aux is None else int(draft.aux.tokens.shape[0])


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

