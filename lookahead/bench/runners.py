"""How one request is run and measured under one strategy.

Engine strategies go through `lookahead.generate`; the reference rows `hf_generate` and
`hf_prompt_lookup` go through transformers' own `model.generate()`. Both are timed the same way:
wall time around the call, process CPU time around the call, and device time summed over the
model's forward passes (the engine reports it; for transformers a forward hook measures it).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from lookahead.bench.variants import StrategySpec, parse_strategy
from lookahead.candidates.ngram_cache import NGramCache
from lookahead.candidates.recycling import SuccessorTable
from lookahead.config import LookaheadConfig, PromptLookupConfig, SamplingConfig, SpeculativeConfig
from lookahead.engine.calibration import Calibrator
from lookahead.engine.prefix_cache import PrefixCache

HF_GENERATE = "hf_generate"
HF_PROMPT_LOOKUP = "hf_prompt_lookup"
REFERENCE_STRATEGIES = (HF_GENERATE, HF_PROMPT_LOOKUP)
PROMPT_LOOKUP_NUM_TOKENS = 3


@dataclass(frozen=True)
class RunSpec:
    """What one measured call is asked to do."""

    max_new_tokens: int
    sampling: SamplingConfig
    lookahead: LookaheadConfig
    request_class: str = ""
    repeat: int = 0  # which pass over the requests (what a class learned is kept per pass)


@dataclass(frozen=True)
class Measurement:
    """What one call produced and cost. Counts follow the engine's conventions (docs/bench.md)."""

    token_ids: tuple[int, ...]
    finish_reason: str
    prompt_tokens: int
    new_tokens: int
    steps: int
    guesses_verified: int
    guesses_accepted: int
    processed_tokens: int
    prefill_s: float
    decode_s: float
    total_s: float
    ttft_s: float
    device_s: float
    cpu_s: float
    draft_steps: int = 0  # a draft model's forward passes (speculative), part of device_s
    draft_s: float = 0.0
    ngram_cache_bytes: int = 0  # the class's cross-request n-gram cache after this request
    cached_tokens: int = 0  # prompt tokens the prefix cache supplied (not prefilled)
    dtype: str = ""  # the weights' dtype that ran
    width_floor: int | None = None  # engine passes were padded to this many rows (None: unpadded)
    accepted_by_source: Mapping[str, int] = field(default_factory=dict)  # new tokens per source ("model": its own)


Runner = Callable[[Any, list[int], RunSpec], Measurement]

# Extra strategies injected by tests only (e.g. one that plants a wrong token). Empty in production.
EXTRA_RUNNERS: dict[str, Runner] = {}


def output_digest(token_ids: Sequence[int], eos_ids: Sequence[int]) -> str:
    """sha256 of the output up to (not including) the first end-of-sequence token."""
    ids = list(token_ids)
    eos = set(eos_ids)
    for i, t in enumerate(ids):
        if t in eos:
            ids = ids[:i]
            break
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()


def engine_runner(variant: StrategySpec | str) -> Runner:
    """A runner for one of `lookahead.engine.STRATEGIES`, with the label's parameters. Like the server it
    keeps one calibrator and one table of recycled successors per request class (engine/shared.py), and
    with /cache one cross-request n-gram cache per class, all warmed by this runner's earlier requests
    in run order (a resumed run starts them empty). The calibrator and the successors are kept per
    repeat too: a request's second repeat must not find its own first answer's successors. Like the
    server it keeps one prefix cache across classes (engine/prefix_cache.py), per repeat (a repeat must
    not find its own prompt) and per runner: every strategy sees the same requests in the same order,
    so each finds the same prefixes stored, and no strategy finds prompts another one prefilled."""
    if isinstance(variant, str):
        variant = parse_strategy(variant, engine_strategies())
    caches: dict[str, NGramCache] = {}
    calibrators: dict[tuple[str, int], Calibrator] = {}
    successors: dict[tuple[str, int], SuccessorTable] = {}
    prefixes: dict[int, PrefixCache] = {}

    def run(loaded: Any, prompt_ids: list[int], spec: RunSpec) -> Measurement:
        import lookahead

        cache = caches.setdefault(spec.request_class, NGramCache()) if variant.ngram_cache else None
        learned = (spec.request_class, spec.repeat)
        cfg = variant.config
        cpu0 = time.process_time()
        wall0 = time.perf_counter()
        result = lookahead.generate(
            loaded, prompt_ids, max_new_tokens=spec.max_new_tokens, strategy=variant.strategy,
            lookahead=variant.lookahead_or(spec.lookahead), sampling=spec.sampling,
            prompt_lookup=cfg if isinstance(cfg, PromptLookupConfig) else None,
            speculative=cfg if isinstance(cfg, SpeculativeConfig) else None, ngram_cache=cache,
            exact=variant.exact, calibrator=calibrators.setdefault(learned, Calibrator()),
            successors=successors.setdefault(learned, SuccessorTable()),
            prefix_cache=prefixes.setdefault(spec.repeat, PrefixCache()) if variant.prefix_cache else False,
        )
        wall = time.perf_counter() - wall0
        cpu = time.process_time() - cpu0
        s = result.stats
        total = float(getattr(s, "total_s", wall) or wall)
        return Measurement(
            token_ids=tuple(int(t) for t in result.token_ids),
            finish_reason=str(result.finish_reason),
            prompt_tokens=int(s.prompt_tokens),
            new_tokens=int(s.new_tokens),
            steps=int(s.steps),
            guesses_verified=int(s.guesses_verified),
            guesses_accepted=int(s.guesses_accepted),
            processed_tokens=int(s.processed_tokens),
            prefill_s=float(s.prefill_s),
            decode_s=float(s.decode_s),
            total_s=total,
            ttft_s=float(s.ttft_s),
            device_s=float(s.device_s),
            cpu_s=cpu,
            draft_steps=int(s.draft_steps),
            draft_s=float(s.draft_s),
            ngram_cache_bytes=int(cache.memory()["bytes"]) if cache is not None else 0,
            cached_tokens=int(s.cached_tokens),
            dtype=result.dtype,
            width_floor=result.width_floor,
            accepted_by_source=dict(s.accepted_by_source),
        )

    return run


class _ForwardProbe:
    """Forward hooks that time every model call and record its query length."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.calls: list[tuple[float, float, int]] = []  # (start, end, query tokens)
        self._start = 0.0
        self._q = 0
        self._handles: list[Any] = []

    def _pre(self, _module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        x = kwargs.get("input_ids")
        if x is None and args:
            x = args[0]
        if x is None:
            x = kwargs.get("inputs_embeds")
        self._q = int(x.shape[1]) if x is not None and getattr(x, "dim", lambda: 0)() >= 2 else 1
        self._start = time.perf_counter()

    def _post(self, _module: Any, _args: Any, _kwargs: Any, _out: Any) -> None:
        self.calls.append((self._start, time.perf_counter(), self._q))

    def __enter__(self) -> _ForwardProbe:
        self._handles = [
            self.model.register_forward_pre_hook(self._pre, with_kwargs=True),
            self.model.register_forward_hook(self._post, with_kwargs=True),
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()


def hf_runner(prompt_lookup: bool) -> Runner:
    """transformers' own generate(): greedy, or sampling seeded with torch.manual_seed(request seed)."""

    def run(loaded: Any, prompt_ids: list[int], spec: RunSpec) -> Measurement:
        from transformers import GenerationConfig

        samp = spec.sampling
        eos = list(loaded.eos_token_ids)
        kwargs: dict[str, Any] = {
            "max_new_tokens": spec.max_new_tokens, "min_new_tokens": 0, "use_cache": True,
            "num_beams": 1, "do_sample": not samp.greedy,
            "eos_token_id": eos or None, "pad_token_id": eos[0] if eos else 0,
            # neutral values, so a model's generation_config.json cannot change what is measured
            "repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "typical_p": 1.0,
            "epsilon_cutoff": 0.0, "eta_cutoff": 0.0,
        }
        if not samp.greedy:
            kwargs.update(temperature=samp.temperature, top_p=samp.top_p, top_k=samp.top_k)
        if prompt_lookup:
            kwargs["prompt_lookup_num_tokens"] = PROMPT_LOOKUP_NUM_TOKENS
        config = GenerationConfig(**kwargs)
        ids = torch.tensor([prompt_ids], dtype=torch.long)
        mask = torch.ones_like(ids)
        if not samp.greedy:
            torch.manual_seed(samp.seed)
        with _ForwardProbe(loaded.model) as probe:
            cpu0 = time.process_time()
            wall0 = time.perf_counter()
            with torch.inference_mode():
                out = loaded.model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
            wall_end = time.perf_counter()
            cpu = time.process_time() - cpu0
        gen = [int(t) for t in out[0, len(prompt_ids):].tolist()]
        calls = probe.calls
        if not calls:
            raise RuntimeError("transformers generate() ran no forward pass; cannot time it")
        first_end = calls[0][1]
        decode_q = [q for _, _, q in calls[1:]]
        steps = len(calls)  # the prefill pass yields the first token, like the engine's first step
        return Measurement(
            token_ids=tuple(gen),
            finish_reason="stop" if gen and gen[-1] in eos else "length",
            prompt_tokens=len(prompt_ids),
            new_tokens=len(gen),
            steps=steps,
            guesses_verified=sum(q - 1 for q in decode_q),
            guesses_accepted=max(0, len(gen) - steps),
            processed_tokens=1 + sum(decode_q),
            prefill_s=calls[0][1] - calls[0][0],
            decode_s=wall_end - first_end,
            total_s=wall_end - wall0,
            ttft_s=first_end - wall0,
            device_s=sum(e - s for s, e, _ in calls),
            cpu_s=cpu,
            dtype=str(getattr(loaded, "dtype", "")).replace("torch.", ""),
        )

    return run


def available_strategies() -> tuple[str, ...]:
    """Every name `--strategies` accepts: the engine's, the transformers references, test hooks."""
    from lookahead.config import STRATEGIES

    return tuple(STRATEGIES) + REFERENCE_STRATEGIES + tuple(EXTRA_RUNNERS)


def engine_strategies() -> tuple[str, ...]:
    from lookahead.config import STRATEGIES

    return tuple(STRATEGIES)


def get_runner(name: str) -> Runner:
    if name in EXTRA_RUNNERS:
        return EXTRA_RUNNERS[name]
    if name == HF_GENERATE:
        return hf_runner(prompt_lookup=False)
    if name == HF_PROMPT_LOOKUP:
        return hf_runner(prompt_lookup=True)
    variant = parse_strategy(name, available_strategies())  # a ConfigError names the fix
    return engine_runner(variant)
