"""The generation loop shared by every strategy, as a generator of accepted runs.

    1. encode and validate the request
    2. prefill the prompt into the KV cache
    3. repeat: propose -> allocate -> one step (forward, verify, compact KV) -> stop rules -> emit -> update
    4. report the result and its statistics

A single request is the batch-of-one case of the continuous-batching scheduler (lookahead/scheduler),
which ties the engine (lookahead/engine: step, allocator, cost curve) to the candidate sources
(lookahead/candidates, by strategy name through candidates/registry.py); the engine imports neither.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from lookahead.candidates.ngram_cache import NGramCache
from lookahead.candidates.recycling import SuccessorTable
from lookahead.config import GREEDY, GenerationConfig, LookaheadConfig, PromptLookupConfig, SamplingConfig, SpeculativeConfig
from lookahead.engine.calibration import Calibrator, shared_calibrator
from lookahead.engine.costs import CostCurve
from lookahead.engine.numerics import width_probe
from lookahead.engine.prefix_cache import PrefixCache
from lookahead.engine.sampling import TokenChooser
from lookahead.engine.shared import shared
from lookahead.engine.step import StepRunner
from lookahead.errors import ConfigError
from lookahead.models.loader import LoadedModel, PromptLike
from lookahead.scheduler.request import GenerationResult, GenerationStats, Request, StepEvent
from lookahead.scheduler.scheduler import Scheduler, SchedulerConfig, device_costs

__all__ = ["GenerationResult", "GenerationStats", "StepEvent", "device_costs", "engine_cost_curve", "generate",
           "stream", "stream_events"]


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
    successors: SuccessorTable | None = None,
    key_views: bool = False,
    aligned_trees: bool = True,
    prefix_cache: PrefixCache | bool = True,
) -> Iterator[StepEvent]:
    """`draft`: a draft model for strategy "speculative" (else `speculative.draft` is resolved);
    `ngram_cache`: cross-request n-grams, offered to "lookahead"/"prompt_lookup" and updated with the
    finished response whatever the strategy. `exact`: pad every pass to the model's width floor where
    one exists (engine/numerics.py), so that every strategy's tokens are bit-identical to padded
    autoregressive decoding at any precision; False runs unpadded (the fastest plain path, identical
    to the others only up to float rounding). `calibrator`: acceptance estimates (engine/calibration.py);
    None: the one this process's requests on the model share for this strategy and decoding mode
    (greedy or sampled), and then also the model's recycled successors (engine/shared.py); pass
    `Calibrator()` for a request that learns alone; `successors`: the recycled successors
    (candidates/recycling.SuccessorTable) to learn into and guess from (None: the shared table when
    `calibrator` is None, else this request's own); `adaptive`: size each step with
    the allocator (engine/allocator.py; False: verify every draft as proposed); `key_views`: exact
    steps may also verify a second chain of the tree, over key views, where the probe found them exact
    (engine/attention.py; off by default: on the 2-core Zen 4 they cost more than they settled,
    docs/measurements.md, "Measured: exact bfloat16 trees"); `aligned_trees`: exact steps verify whole
    trees, each node's key at an offset where the kernels reduce it as in autoregressive decoding,
    where the probe found that exact (engine/query.py align_tree; on by default; on the C++ attention kernel any offset is
    exact, so trees go as they come and key views are never needed; False: each tree's first chain
    only, docs/measurements.md, "Measured: exact trees at aligned key offsets"); `prefix_cache`: reuse the
    longest stored prefix of the prompt's keys and values and store this prompt's (engine/prefix_cache.py;
    only where the model's prefill splits to the same bits, so never a changed token): True, the model's
    shared one in this process; a PrefixCache, that one; False, prefill the whole prompt."""
    if calibrator is not None and not isinstance(calibrator, Calibrator):
        raise ConfigError(f"calibrator must be a lookahead.engine.calibration.Calibrator (or None: the model's "
                          f"shared one), got {type(calibrator).__name__}")
    if not isinstance(prefix_cache, (bool, PrefixCache)):
        raise ConfigError(f"prefix_cache must be True (the model's shared one), False (none) or a "
                          f"lookahead.engine.prefix_cache.PrefixCache, got {type(prefix_cache).__name__}")
    if successors is not None and not isinstance(successors, SuccessorTable):
        raise ConfigError(f"successors must be a lookahead.candidates.recycling.SuccessorTable (or None), "
                          f"got {type(successors).__name__}")
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
    # 1. Encode and validate; a scheduler of one (the batch-of-one case of continuous batching).
    prompt_ids = loaded.encode(prompt, raw=raw)
    if prefix_cache is True:
        prefix_cache = shared(loaded.model, "prefix-cache", "", PrefixCache)
    scheduler = Scheduler(loaded, SchedulerConfig(max_batch=1, exact=cfg.exact, widest=cfg.widest_step,
                                                  key_views=key_views, aligned_trees=aligned_trees),
                          prefix_cache if isinstance(prefix_cache, PrefixCache) else None)
    if calibrator is None:  # what earlier requests of this kind learned (engine/shared.py)
        label = f"{cfg.strategy}/{'greedy' if cfg.sampling.greedy else 'sampled'}"
        calibrator = shared_calibrator(loaded.model, label)
        if successors is None:
            successors = shared(loaded.model, "successors", label, SuccessorTable)
    request = Request(loaded, prompt_ids, cfg, draft=draft, ngram_cache=ngram_cache, calibrator=calibrator,
                      successors=successors)

    # 2. Prefill: cache all prompt tokens but the last, which is the first step's root.
    scheduler.add(request)

    # 3. Decode: one forward pass per step, at least one token per step (scheduler.py: propose ->
    #    allocate -> step -> absorb); the last event carries the result.
    while scheduler.active:
        for _, event in scheduler.step():
            yield event


def engine_cost_curve(loaded: LoadedModel, exact: bool = True, remeasure: bool = False,
                      key_views: bool = False) -> CostCurve:
    """The curve the allocator reads for default generation settings (exact passes unless told;
    `key_views`: the curve of passes that may verify branches over key views, with its surcharge)."""
    cfg = GenerationConfig(exact=exact)
    numerics = width_probe(loaded.model, cfg.widest_step) if exact else None
    vocab = loaded.model.get_output_embeddings().weight.shape[0]
    runner = StepRunner(loaded.model, TokenChooser(cfg.sampling, vocab), numerics, key_views=key_views)
    return device_costs(loaded, runner, remeasure)


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

