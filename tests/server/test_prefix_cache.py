"""The server's prefix cache: a prompt that starts like an earlier one reports its reused tokens in
usage.prompt_tokens_details.cached_tokens (OpenAI's field) and answers the same; --prefix-cache-mb 0 turns
it off; /metrics shows what it holds."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lookahead.errors import ConfigError
from lookahead.server import ServerConfig
from lookahead.testing import tiny_model

from .live import serve
from .test_metrics_policy import samples, value

SYSTEM = "You are a terse assistant for a hardware shop. Prices are in euros; never invent a product. " * 2


def _ask(client: Any, question: str) -> Any:
    return client.chat.completions.create(model="tiny-llama", max_tokens=12, temperature=0, messages=[
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])


@pytest.fixture(scope="module")
def bf16() -> Any:
    return tiny_model("llama", dtype=torch.bfloat16)  # the prefill kernel's split is exact by construction


def test_a_shared_system_prompt_is_prefilled_once(bf16: Any) -> None:
    with serve(bf16, ServerConfig(adaptive=False)) as server:
        client = server.openai()
        first, again, other = _ask(client, "Do you sell drills?"), _ask(client, "Do you sell drills?"), \
            _ask(client, "Any hammers?")
        details = [r.usage.prompt_tokens_details.cached_tokens for r in (first, again, other)]
        assert details[0] == 0
        assert details[1] == (first.usage.prompt_tokens - 1) // 16 * 16  # all whole blocks but the last token's
        assert 2 * len(SYSTEM) > details[2] >= len(SYSTEM) // 16 * 16  # the shared system prompt
        assert again.choices[0].message.content == first.choices[0].message.content
        with server.http() as http:
            metrics = samples(http.get("/metrics").text)
        assert value(metrics, "lookahead_prefix_cache_bytes") > 0
        assert value(metrics, "lookahead_prefix_cache_reused_tokens") == details[1] + details[2]
    with serve(bf16, ServerConfig(adaptive=False, prefix_cache_mb=0)) as server:
        off = [_ask(server.openai(), "Do you sell drills?") for _ in range(2)]
        assert [r.usage.prompt_tokens_details.cached_tokens for r in off] == [0, 0]
        assert off[1].choices[0].message.content == first.choices[0].message.content


@pytest.mark.parametrize("mb", [-1, 1.5, True])
def test_the_size_is_checked(mb: Any) -> None:
    with pytest.raises(ConfigError, match="prefix cache mb"):
        ServerConfig(prefix_cache_mb=mb)
