"""The official `openai` client against a live server on the tiny model."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from lookahead.server import ServerConfig

from .live import CHAT, Live, serve

MODEL = "tiny-llama"


def chat(client: openai.OpenAI, **kwargs: Any) -> Any:
    return client.chat.completions.create(model=MODEL, messages=CHAT, **kwargs)


def accepted_guesses(reply: Any) -> int:
    """Guessed tokens the model confirmed: each step yields one token of its own plus those."""
    return int(reply.usage.completion_tokens) - int(reply.usage.model_extra["lookahead"]["steps"])


def stream_chat(client: openai.OpenAI, **kwargs: Any) -> tuple[str, list[Any]]:
    chunks = list(chat(client, stream=True, **kwargs))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks


def test_models_lists_the_loaded_model(live: Live) -> None:
    client = live.openai()
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


def test_chat_non_streaming_greedy_matches_the_engine(live: Live, tiny: Any) -> None:
    import lookahead

    reply = chat(live.openai(), max_tokens=24, temperature=0)
    expected = lookahead.generate(tiny, CHAT, max_new_tokens=24, strategy="autoregressive")
    assert reply.object == "chat.completion"
    assert reply.model == MODEL
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == expected.text
    assert reply.choices[0].finish_reason == expected.finish_reason
    assert accepted_guesses(reply) > 0  # lossless *with* speculation: guesses were verified and kept


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.9, "top_p": 0.95, "seed": 11}])
def test_chat_streaming_equals_non_streaming(live: Live, sampling: dict[str, Any]) -> None:
    client = live.openai()
    full = chat(client, max_tokens=40, **sampling)
    text, chunks = stream_chat(client, max_tokens=40, **sampling)
    assert text == full.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)


def test_completions_streaming_equals_non_streaming(live: Live, tiny: Any) -> None:
    client = live.openai()
    full = client.completions.create(model=MODEL, prompt="def fib(n):", max_tokens=30, temperature=0)
    parts = list(
        client.completions.create(model=MODEL, prompt="def fib(n):", max_tokens=30, temperature=0, stream=True)
    )
    assert full.object == "text_completion"
    assert "".join(p.choices[0].text for p in parts) == full.choices[0].text
    assert full.usage is not None and full.usage.prompt_tokens == len(tiny.encode("def fib(n):", raw=True))
    # Token ids are a prompt too, and give the same continuation.
    ids = tiny.encode("def fib(n):", raw=True)
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=30, temperature=0)
    assert by_ids.choices[0].text == full.choices[0].text


def test_a_step_that_accepts_several_tokens_is_one_chunk(live: Live) -> None:
    _, chunks = stream_chat(live.openai(), max_tokens=64, temperature=0, stream_options={"include_usage": True})
    usage = chunks[-1].usage
    content_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content]
    steps = usage.model_extra["lookahead"]["steps"]
    assert usage.completion_tokens == 64
    assert len(content_chunks) <= steps < 64  # one chunk per step, several tokens per step (guesses accepted)
    assert chunks[-1].choices == [] and all(c.usage is None for c in chunks[:-1])


def test_seeded_sampling_is_reproducible_and_lossless(live: Live) -> None:
    client = live.openai()
    args = {"max_tokens": 32, "temperature": 1.0, "seed": 1234}
    a = chat(client, **args).choices[0].message.content
    b = chat(client, **args).choices[0].message.content
    ar = chat(client, **args, extra_body={"lookahead": {"enabled": False}})
    la = chat(client, **args, extra_body={"lookahead": {"window": 3, "ngram": 3, "guesses": 2}})
    # Within the default cap (--client-overrides capped): 1 + 2*3 + 2*6 = 19 query tokens, as W=2 N=4 G=4.
    long_copies = chat(client, **args, extra_body={"lookahead": {"context_tokens": 6, "guesses": 2}})
    other = chat(client, **{**args, "seed": 99}).choices[0].message.content
    assert a == b
    assert ar.usage.model_extra["lookahead"]["strategy"] == "autoregressive"
    assert la.usage.model_extra["lookahead"]["strategy"] == "lookahead"
    assert ar.choices[0].message.content == a == la.choices[0].message.content
    assert long_copies.choices[0].message.content == a
    assert long_copies.usage.model_extra["lookahead"]["strategy"] == "lookahead"
    assert accepted_guesses(la) > 0 and accepted_guesses(long_copies) > 0  # sampled guesses were accepted
    assert other != a  # the seed is really used


def test_stop_strings_end_the_text_before_them(live: Live) -> None:
    client = live.openai()
    reference = chat(client, max_tokens=64, temperature=0).choices[0].message.content
    # A stop string taken from the middle of the reference output.
    start = next(
        i for i in range(8, len(reference) - 2) if reference[i : i + 2].isascii() and reference[i : i + 2].isprintable()
    )
    stop = reference[start : start + 2]
    expected = reference[: reference.index(stop)]
    for stream in (False, True):
        if stream:
            text, chunks = stream_chat(client, max_tokens=64, temperature=0, stop=[stop, "\x00never"])
            finish = chunks[-1].choices[0].finish_reason
        else:
            reply = chat(client, max_tokens=64, temperature=0, stop=stop)
            text, finish = reply.choices[0].message.content, reply.choices[0].finish_reason
        assert text == expected
        assert finish == "stop"


def test_usage_fields(tiny: Any) -> None:
    price = 3.6  # USD per device-hour: cost_usd == device_seconds / 1000
    with serve(tiny, ServerConfig(price_per_hour_usd=price, adaptive=False)) as server:
        reply = chat(server.openai(), max_tokens=20, temperature=0, user="u-1")
    usage = reply.usage
    assert usage.prompt_tokens == len(tiny.encode(CHAT))
    assert usage.completion_tokens == 20 and reply.choices[0].finish_reason == "length"
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    la = usage.model_extra["lookahead"]
    assert set(la) == {
        "strategy",
        "steps",
        "tokens_per_step",
        "acceptance_rate",
        "decode_seconds",
        "device_seconds",
        "cost_usd",
    }
    assert la["strategy"] == "lookahead"
    assert 1 <= la["steps"] < 20  # guesses were accepted
    assert la["tokens_per_step"] == pytest.approx(20 / la["steps"], abs=1e-3)
    assert 0.0 < la["acceptance_rate"] <= 1.0
    assert 0.0 < la["decode_seconds"] and 0.0 < la["device_seconds"]
    assert la["cost_usd"] == pytest.approx(la["device_seconds"] * price / 3600, rel=1e-3)


def test_max_completion_tokens_and_default_budget(tiny: Any) -> None:
    with serve(tiny, ServerConfig(default_max_tokens=7)) as server:
        client = server.openai()
        assert chat(client, max_completion_tokens=5, temperature=0).usage.completion_tokens == 5
        assert chat(client, temperature=0).usage.completion_tokens <= 7


def test_auth_on(tiny: Any) -> None:
    with serve(tiny, ServerConfig(api_key="s3cret")) as server:
        assert chat(server.openai(api_key="s3cret"), max_tokens=4, temperature=0).usage.completion_tokens == 4
        for wrong in ("nope", "s3cret-but-longer", "s3cre"):
            with pytest.raises(openai.AuthenticationError) as err:
                chat(server.openai(api_key=wrong), max_tokens=4)
            assert err.value.status_code == 401
            assert err.value.response.json()["error"]["code"] == "invalid_api_key"
        with server.http() as http:
            assert http.get("/health").status_code == 200  # open, for load balancers
            for path in ("/metrics", "/v1/models", "/v1/policy", "/openapi.json"):
                r = http.get(path)
                assert r.status_code == 401 and set(r.json()["error"]) == {"message", "type", "param", "code"}
            assert http.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200
            assert http.get("/v1/models", headers={"Authorization": "Basic s3cret"}).status_code == 401


def test_auth_off_accepts_any_key(live: Live) -> None:
    # greedy: with the default temperature 1 and no seed, the tiny model may sample its EOS token first
    assert chat(live.openai(api_key="anything"), max_tokens=2, temperature=0).usage.completion_tokens == 2
