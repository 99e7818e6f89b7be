"""The official openai client against the server on the embedded SmolLM2-135M-Instruct (short)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import lookahead
from lookahead.server import ServerConfig

from .live import Live, serve

pytestmark = pytest.mark.real_model

MESSAGES = [{"role": "user", "content": "List three prime numbers."}]


@pytest.fixture(scope="module")
def smol() -> Iterator[Live]:
    loaded = lookahead.load(lookahead.DEFAULT_MODEL)
    with serve(loaded, ServerConfig()) as server:
        yield server


def test_real_model_chat_streaming_and_lossless(smol: Live) -> None:
    client = smol.openai()
    name = client.models.list().data[0].id
    args: dict[str, Any] = {"model": name, "messages": MESSAGES, "max_tokens": 16, "temperature": 0}
    full = client.chat.completions.create(**args)
    text = full.choices[0].message.content
    assert text and text.strip()
    assert full.usage.completion_tokens <= 16
    assert full.usage.model_extra["lookahead"]["strategy"] == "lookahead"
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**args, stream=True))
    assert streamed == text
    plain = client.chat.completions.create(**args, extra_body={"lookahead": {"enabled": False}})
    assert plain.choices[0].message.content == text
    assert plain.usage.model_extra["lookahead"]["strategy"] == "autoregressive"
