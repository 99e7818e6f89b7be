"""Request bodies of the OpenAI-compatible endpoints, validated strictly (wrong types are 400s).

Fields OpenAI defines that this server cannot honour are accepted only at their neutral value
(e.g. `logprobs: false`, `frequency_penalty: 0`) and rejected with a clear message otherwise; fields
nobody defines are rejected as OpenAI does ("Unrecognized request argument"). Strings holding lone
surrogates (JSON escapes such as "\\ud800") fail pydantic's str validation, so text that cannot be
encoded never reaches the tokenizer.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_STRICT = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)
_MAX_TEXT = 1_000_000  # characters per string field; the body limit usually bites first

Text = Annotated[str, Field(max_length=_MAX_TEXT)]


class LookaheadOptions(BaseModel):
    """Our extension: `"lookahead": {"enabled": bool, "window": W, "ngram": N, "guesses": G,
    "context_tokens": T}`."""

    model_config = _STRICT
    enabled: bool | None = None
    window: Annotated[int, Field(ge=1, le=64)] | None = None
    ngram: Annotated[int, Field(ge=2, le=16)] | None = None
    guesses: Annotated[int, Field(ge=0, le=64)] | None = None
    context_tokens: Annotated[int, Field(ge=1, le=64)] | None = None


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool | None = None
    include_obfuscation: bool | None = None  # OpenAI's; nothing to obfuscate here, accepted and ignored


class TextPart(BaseModel):
    model_config = _STRICT
    type: Literal["text"]
    text: Text


class ChatMessage(BaseModel):
    model_config = _STRICT
    role: Literal["system", "developer", "user", "assistant"]
    content: Text | Annotated[list[TextPart], Field(max_length=256)]
    name: Annotated[str, Field(max_length=256)] | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


def _neutral(value: Any, neutral: tuple[Any, ...], name: str, hint: str) -> None:
    if value is not None and value not in neutral:
        raise ValueError(f"{name}={value!r} is not supported by this server; {hint}")


class CommonFields(BaseModel):
    """Fields shared by /v1/chat/completions and /v1/completions."""

    model_config = _STRICT
    model: Annotated[str, Field(min_length=1, max_length=512)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    seed: Annotated[int, Field(ge=0, lt=2**63)] | None = None
    stop: (
        Annotated[str, Field(min_length=1, max_length=256)]
        | Annotated[list[Annotated[str, Field(min_length=1, max_length=256)]], Field(max_length=4)]
        | None
    ) = None
    n: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: Annotated[str, Field(max_length=512)] | None = None
    metadata: Annotated[dict[str, Annotated[str, Field(max_length=512)]], Field(max_length=16)] | None = None
    lookahead: LookaheadOptions | None = None
    # OpenAI fields accepted only at their neutral value.
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    service_tier: str | None = None
    store: bool | None = None

    @model_validator(mode="after")
    def _supported(self) -> CommonFields:
        if self.n is not None and self.n != 1:
            raise ValueError(f"n={self.n} is not supported: this server returns one choice; send n separate requests")
        _neutral(self.frequency_penalty, (0, 0.0), "frequency_penalty", "leave it out")
        _neutral(self.presence_penalty, (0, 0.0), "presence_penalty", "leave it out")
        if self.logit_bias:
            raise ValueError("logit_bias is not supported by this server; leave it out")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed with stream: true")
        return self

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def completion_budget(self) -> int | None:
        return self.max_tokens

    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class ChatCompletionRequest(CommonFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=1024)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    modalities: list[str] | None = None

    @model_validator(mode="after")
    def _chat_supported(self) -> ChatCompletionRequest:
        _neutral(self.logprobs, (False,), "logprobs", "leave it out")
        _neutral(self.top_logprobs, (0,), "top_logprobs", "leave it out")
        if self.tools:
            raise ValueError("tools are not supported by this server; leave them out")
        _neutral(self.tool_choice, ("none", "auto"), "tool_choice", "leave it out")
        if self.response_format is not None and self.response_format != {"type": "text"}:
            raise ValueError('response_format other than {"type": "text"} is not supported; leave it out')
        if self.modalities is not None and self.modalities != ["text"]:
            raise ValueError('modalities other than ["text"] are not supported; leave it out')
        if (
            self.max_tokens is not None
            and self.max_completion_tokens is not None
            and self.max_tokens != self.max_completion_tokens
        ):
            raise ValueError("max_tokens and max_completion_tokens disagree; give only one of them")
        return self

    def completion_budget(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1, max_length=1_000_000)]


class CompletionRequest(CommonFields):
    prompt: (
        Text | TokenIds | Annotated[list[Text], Field(min_length=1)] | Annotated[list[TokenIds], Field(min_length=1)]
    )
    echo: bool | None = None
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: Any) -> Any:
        if isinstance(v, list) and v and isinstance(v[0], (str, list)) and len(v) > 1:
            raise ValueError(
                f"a batch of {len(v)} prompts is not supported: this server answers one prompt per request; "
                "send them as separate requests"
            )
        return v

    @model_validator(mode="after")
    def _completion_supported(self) -> CompletionRequest:
        _neutral(self.echo, (False,), "echo", "leave it out")
        _neutral(self.logprobs, (0,), "logprobs", "leave it out")
        _neutral(self.best_of, (1,), "best_of", "leave it out")
        _neutral(self.suffix, ("",), "suffix", "leave it out")
        return self

    def single_prompt(self) -> str | list[int]:
        """The one prompt: a string or token ids (a batch of one is unwrapped)."""
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            return p[0]
        return p  # type: ignore[return-value]
