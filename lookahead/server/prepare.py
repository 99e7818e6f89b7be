"""From a validated request body to a JobSpec: model check, tokenization, budget, strategy, sampling."""

from __future__ import annotations

import dataclasses
import logging
import secrets
from collections.abc import Mapping
from typing import Any

from jinja2 import TemplateError

from lookahead.config import LookaheadConfig, SamplingConfig, SpeculativeConfig
from lookahead.errors import ConfigError, LookaheadError
from lookahead.policy import Decision
from lookahead.server.config import ALL_CLASSES, CLASS_RE, ServerConfig
from lookahead.server.errors import APIError, bad_request
from lookahead.server.metrics import ServerMetrics
from lookahead.server.schemas import ChatCompletionRequest, CommonFields, CompletionRequest
from lookahead.server.worker import JobSpec

log = logging.getLogger("lookahead.server")

CLASS_HEADER = "x-request-class"


def request_class_of(header: str | None, metadata: dict[str, str] | None) -> str | None:
    """The request class: header X-Request-Class, else metadata.request_class, else None."""
    value = header if header is not None else (metadata or {}).get("request_class")
    if value is None:
        return None
    if not CLASS_RE.fullmatch(value):
        raise bad_request(
            f"request class {value[:80]!r} is invalid: use 1-64 letters, digits, '_', '.', ':' or '-'",
            param="metadata.request_class" if header is None else None,
            code="invalid_request_class",
        )
    return value


def check_model(requested: str, loaded: Any) -> None:
    if requested != loaded.name:
        raise APIError(
            404,
            f"The model {requested!r} does not exist on this server; it serves {loaded.name!r} (see GET /v1/models)",
            param="model",
            code="model_not_found",
        )


def encode_chat(loaded: Any, body: ChatCompletionRequest) -> list[int]:
    """Token ids of the chat, through the model's chat template (runs in a worker thread of the loop)."""
    messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in body.messages]
    return _encode(loaded, messages, raw=False, param="messages")


def encode_completion(loaded: Any, body: CompletionRequest) -> list[int]:
    prompt = body.single_prompt()
    if isinstance(prompt, list):
        vocab = loaded.model.get_input_embeddings().num_embeddings
        bad = next((t for t in prompt if t >= vocab), None)
        if bad is not None:
            raise bad_request(
                f"prompt token id {bad} is out of range: the vocabulary has {vocab} tokens", param="prompt"
            )
        return list(prompt)
    return _encode(loaded, prompt, raw=True, param="prompt")


def _encode(loaded: Any, prompt: Any, *, raw: bool, param: str) -> list[int]:
    try:
        ids = loaded.encode(prompt, raw=raw)
    except LookaheadError as exc:
        raise bad_request(str(exc), param=param, code="invalid_prompt") from None
    except (
        TemplateError,
        ValueError,
        TypeError,
        KeyError,
        IndexError,
    ) as exc:  # the chat template or tokenizer refused
        log.info("tokenization refused a request: %s: %s", type(exc).__name__, exc)
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise bad_request(
            f"the model's tokenizer or chat template rejected this input: {first_line[:300]}",
            param=param,
            code="invalid_prompt",
        ) from None
    if not ids:
        raise bad_request("the prompt encodes to no tokens; send some text", param=param, code="invalid_prompt")
    return [int(t) for t in ids]


def completion_budget(body: CommonFields, prompt_tokens: int, loaded: Any, config: ServerConfig) -> int:
    """max_tokens as asked, or the server default capped by the context; 400 when it cannot fit."""
    context = int(loaded.context_length)
    asked = body.completion_budget()
    room = context - prompt_tokens
    if asked is None:
        if room >= 1:
            return min(config.default_max_tokens, room)
        asked = 1
    if asked > room:
        raise bad_request(
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{prompt_tokens + asked} tokens ({prompt_tokens} in the prompt, {asked} for the completion). "
            "Please reduce the length of the prompt or max_tokens.",
            param="max_tokens",
            code="context_length_exceeded",
        )
    return asked


def choose_strategy(body: CommonFields, request_class: str | None, max_tokens: int, config: ServerConfig) -> Decision:
    """The request's own `lookahead` field wins over the policy, as far as --client-overrides allows."""
    decision = config.policy.decide(request_class, max_tokens)
    opts = body.lookahead
    if opts is None:
        return decision
    given = [name for name in ("enabled", "window", "ngram", "guesses", "context_tokens") if getattr(opts, name) is not None]
    if given and config.client_overrides == "off":
        raise bad_request(
            "this server does not take per-request decoding overrides (started with --client-overrides off); "
            f"remove 'lookahead' ({', '.join(given)}) from the request: the server's policy decides",
            param="lookahead",
            code="override_not_allowed",
        )
    if opts.enabled is False:
        return Decision("autoregressive")  # one query token a step: never more than the policy's
    if not given:
        return decision
    base_decision = decision if decision.lookahead is not None else Decision("lookahead")
    base = base_decision.lookahead or LookaheadConfig()
    try:
        shape = dataclasses.replace(
            base,
            window=base.window if opts.window is None else opts.window,
            ngram=base.ngram if opts.ngram is None else opts.ngram,
            guesses=base.guesses if opts.guesses is None else opts.guesses,
            context_tokens=base.context_tokens if opts.context_tokens is None else opts.context_tokens,
        )
    except ConfigError as exc:
        raise bad_request(str(exc), param="lookahead", code="invalid_value") from None
    chosen = Decision(base_decision.strategy, shape)
    limit = decision.query_tokens
    if config.client_overrides == "capped" and chosen.query_tokens > limit:
        extra = "" if shape.context_tokens is None else f" context_tokens={shape.context_tokens}"
        raise bad_request(
            f"the requested lookahead ({chosen.describe()}{extra}) needs up to "
            f"{chosen.query_tokens} query tokens per step, over this server's limit of {limit} for this request "
            f"(its policy's own choice, {decision.describe()}; --client-overrides capped); ask for a smaller "
            "window, ngram, guesses or context_tokens, or leave 'lookahead' out",
            param="lookahead",
            code="override_too_large",
        )
    return chosen


def draft_for(decision: Decision, needed: int, drafts: Mapping[str, Any]) -> Any:
    """The policy's preloaded draft model for a speculative decision (None for a self-draft), after
    checking that this request fits its context (the message names no model: it may be a path)."""
    spec = decision.config
    if not isinstance(spec, SpeculativeConfig) or spec.is_self_draft:
        return None
    draft = drafts.get(spec.draft)
    if draft is None:
        raise APIError(500, "the policy's draft model was not loaded at start", type="server_error")
    if draft.context_length < needed + spec.draft_tokens:
        raise bad_request(
            f"this request may reach {needed + spec.draft_tokens} positions but the draft model the server's policy "
            f"uses for it has a context of {draft.context_length} tokens; lower max_tokens or shorten the prompt",
            param="max_tokens",
            code="context_length_exceeded",
        )
    return draft


def sampling_of(body: CommonFields) -> SamplingConfig:
    """OpenAI defaults: temperature 1, top_p 1; no seed means a fresh random one."""
    temperature = 1.0 if body.temperature is None else float(body.temperature)
    seed = body.seed if body.seed is not None else secrets.randbelow(2**63)
    try:
        return SamplingConfig(
            temperature=temperature, top_p=1.0 if body.top_p is None else float(body.top_p), seed=seed
        )
    except ConfigError as exc:
        raise bad_request(str(exc), code="invalid_value") from None


def build_spec(
    body: CommonFields,
    prompt_ids: list[int],
    request_class: str | None,
    *,
    loaded: Any,
    config: ServerConfig,
    metrics: ServerMetrics,
    drafts: Mapping[str, Any],
    cache_classes: frozenset[str] | None = None,
) -> JobSpec:
    """`cache_classes`: the n-gram cache classes the request's API key may use (None: auth is off)."""
    max_tokens = completion_budget(body, len(prompt_ids), loaded, config)
    decision = choose_strategy(body, request_class, max_tokens, config)
    label = metrics.class_label(request_class)
    return JobSpec(
        prompt_ids=tuple(prompt_ids),
        max_new_tokens=max_tokens,
        decision=decision,
        sampling=sampling_of(body),
        stop=body.stop_list(),
        label=label,
        draft=draft_for(decision, len(prompt_ids) + max_tokens, drafts),
        ngram_cache=cache_classes is None or ALL_CLASSES in cache_classes or label in cache_classes,
    )
