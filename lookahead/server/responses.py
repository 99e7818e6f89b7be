"""OpenAI response bodies and server-sent-event chunks for chat and text completions."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any


def usage(result: Any, *, price_per_hour_usd: float) -> dict[str, Any]:
    """OpenAI `usage`, plus our `lookahead` block (strategy, steps, acceptance, timings, cost)."""
    s = result.stats
    completion = int(s.new_tokens)
    return {
        "prompt_tokens": int(s.prompt_tokens),
        "completion_tokens": completion,
        "total_tokens": int(s.prompt_tokens) + completion,
        "prompt_tokens_details": {"cached_tokens": int(getattr(s, "cached_tokens", 0))},
        "lookahead": {
            "strategy": result.strategy,
            "steps": int(s.steps),
            "tokens_per_step": round(float(s.tokens_per_step), 4),
            "acceptance_rate": round(float(s.acceptance_rate), 4),
            "decode_seconds": round(float(s.decode_s), 6),
            "device_seconds": round(float(s.device_s), 6),
            "cost_usd": float(s.device_s) * price_per_hour_usd / 3600.0,
        },
    }


@dataclass
class Completion:
    """One response being built: ids and timestamps shared by its body or all its chunks."""

    chat: bool
    model: str
    price_per_hour_usd: float
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex

    # -- non-streaming ------------------------------------------------------------------------
    def body(self, result: Any) -> dict[str, Any]:
        if self.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": result.text},
                "logprobs": None,
                "finish_reason": result.finish_reason,
            }
        else:
            choice = {"index": 0, "text": result.text, "logprobs": None, "finish_reason": result.finish_reason}
        return {
            **self._head(chunk=False),
            "choices": [choice],
            "usage": usage(result, price_per_hour_usd=self.price_per_hour_usd),
        }

    # -- streaming ----------------------------------------------------------------------------
    def first_chunk(self, include_usage: bool) -> str | None:
        """Chat streams open with the assistant role, as OpenAI's do."""
        if not self.chat:
            return None
        return self._chunk({"role": "assistant", "content": ""}, None, include_usage)

    def text_chunk(self, text: str, include_usage: bool) -> str:
        return self._chunk({"content": text} if self.chat else text, None, include_usage)

    def final_chunks(self, result: Any, include_usage: bool) -> list[str]:
        out = [self._chunk({} if self.chat else "", result.finish_reason, include_usage)]
        if include_usage:
            data = {
                **self._head(chunk=True),
                "choices": [],
                "usage": usage(result, price_per_hour_usd=self.price_per_hour_usd),
            }
            out.append(sse(data))
        out.append("data: [DONE]\n\n")
        return out

    def _chunk(self, delta: dict[str, Any] | str, finish_reason: str | None, include_usage: bool) -> str:
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish_reason}
        data: dict[str, Any] = {**self._head(chunk=True), "choices": [choice]}
        if include_usage:
            data["usage"] = None
        return sse(data)

    def _head(self, *, chunk: bool) -> dict[str, Any]:
        if self.chat:
            obj = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "system_fingerprint": None}


def sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"
