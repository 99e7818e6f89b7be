"""Per-class policy routing seen through usage.lookahead, GET /v1/policy and parsed /metrics."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import lookahead
from lookahead.config import LookaheadConfig, SpeculativeConfig
from lookahead.policy import Decision, Policy, Rule
from lookahead.server import ServerConfig

from .live import CHAT, Live, serve

MODEL = "tiny-llama"
POLICY = Policy(
    default=Decision("lookahead"),
    classes={
        "code": Decision("lookahead", LookaheadConfig(window=3, ngram=3, guesses=2)),
        "chat": Decision("autoregressive"),
        "extract": Decision("prompt_lookup"),
        # self:2 is the whole 2-layer tiny model: its guesses are the target's, so they are accepted.
        "docs": Decision("speculative", SpeculativeConfig(draft="self:2", draft_tokens=3)),
    },
    rules=(Rule(Decision("autoregressive"), max_tokens_below=6),),
    meta={"source": "test"},
)


@pytest.fixture(scope="module")
def policy_server(tiny: Any) -> Iterator[Live]:
    # adaptive=False: steps run their full drafts whatever the machine's load; overrides "on": the
    # routing test below switches a class to lookahead that the default cap would refuse.
    config = ServerConfig(
        policy=POLICY, policy_source="test policy", price_per_hour_usd=2.0, adaptive=False, client_overrides="on"
    )
    with serve(tiny, config) as server:
        yield server


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} from Prometheus text, via prometheus_client's parser."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(metrics: dict[Any, float], name: str, **labels: str) -> float:
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)


def strategy_of(client: Any, tiny: Any, max_tokens: int, **kwargs: Any) -> str:
    """The strategy that served the request; whichever it is, the text is the greedy autoregressive one,
    and a speculating strategy really had guesses accepted (each step: one model token + accepted guesses)."""
    reply = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=max_tokens, temperature=0, **kwargs)
    reference = lookahead.generate(tiny, CHAT, max_new_tokens=max_tokens, strategy="autoregressive").text
    assert reply.choices[0].message.content == reference
    strategy = str(reply.usage.model_extra["lookahead"]["strategy"])
    accepted = reply.usage.completion_tokens - reply.usage.model_extra["lookahead"]["steps"]
    assert accepted == 0 if strategy == "autoregressive" else accepted > 0, (strategy, accepted)
    return strategy


def test_policy_endpoint_shows_the_policy_in_force(policy_server: Live) -> None:
    with policy_server.http() as http:
        shown = http.get("/v1/policy").json()
    assert shown["source"] == "test policy"
    assert Policy.from_dict(shown["policy"]) == POLICY


def test_classes_rules_and_request_overrides_choose_the_strategy(policy_server: Live, tiny: Any) -> None:
    client = policy_server.openai()
    assert strategy_of(client, tiny, 12) == "lookahead"  # unlabelled: the default
    assert strategy_of(client, tiny, 12, extra_headers={"X-Request-Class": "chat"}) == "autoregressive"
    assert strategy_of(client, tiny, 12, metadata={"request_class": "code"}) == "lookahead"
    assert strategy_of(client, tiny, 5, metadata={"request_class": "code"}) == "autoregressive"  # rule: max_tokens < 6
    assert strategy_of(client, tiny, 12, metadata={"request_class": "unknown-class"}) == "lookahead"  # falls to default
    assert strategy_of(client, tiny, 12, metadata={"request_class": "extract"}) == "prompt_lookup"
    assert strategy_of(client, tiny, 12, metadata={"request_class": "docs"}) == "speculative"
    # The request's own lookahead field wins over the policy, both ways.
    assert (
        strategy_of(client, tiny, 12, metadata={"request_class": "extract"}, extra_body={"lookahead": {"window": 2}})
        == "lookahead"
    )
    assert (
        strategy_of(
            client, tiny, 12, extra_headers={"X-Request-Class": "chat"}, extra_body={"lookahead": {"enabled": True}}
        )
        == "lookahead"
    )
    assert strategy_of(client, tiny, 12, extra_body={"lookahead": {"enabled": False}}) == "autoregressive"


def test_metrics_move_per_class_and_strategy(policy_server: Live) -> None:
    client = policy_server.openai()
    with policy_server.http() as http:
        before = samples(http.get("/metrics").text)
        for _ in range(2):
            client.chat.completions.create(
                model=MODEL, messages=CHAT, max_tokens=16, temperature=0, metadata={"request_class": "code"}
            )
        client.chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=10, temperature=0, extra_headers={"X-Request-Class": "chat"}
        )
        after = samples(http.get("/metrics").text)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    code = {"request_class": "code", "strategy": "lookahead"}
    chat = {"request_class": "chat", "strategy": "autoregressive"}
    assert delta("lookahead_requests_total", status="ok", **code) == 2
    assert delta("lookahead_requests_total", status="ok", **chat) == 1
    assert delta("lookahead_generated_tokens_total", **code) == 32
    assert delta("lookahead_generated_tokens_total", **chat) == 10
    assert delta("lookahead_decode_steps_total", **chat) == 10  # autoregressive: one token per step
    assert 2 <= delta("lookahead_decode_steps_total", **code) < 32  # lookahead: several tokens per step
    assert delta("lookahead_accepted_guesses_total", **code) == 32 - delta("lookahead_decode_steps_total", **code) > 0
    assert delta("lookahead_accepted_guesses_total", **chat) == 0
    assert delta("lookahead_request_latency_seconds_count", **code) == 2
    assert delta("lookahead_time_to_first_token_seconds_count", **chat) == 1
    device = delta("lookahead_device_seconds_total", **code)
    assert device > 0
    assert delta("lookahead_cost_usd_total", **code) == pytest.approx(device * 2.0 / 3600)
    assert value(after, "lookahead_queue_depth") == 0
    assert value(after, "lookahead_price_per_device_hour_usd") == 2.0


def test_class_labels_are_bounded(tiny: Any) -> None:
    with serve(tiny, ServerConfig(policy=POLICY, max_class_labels=1)) as server:
        client = server.openai()
        for name in ("first", "second", "third"):
            client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2, metadata={"request_class": name})
        with server.http() as http:
            metrics = samples(http.get("/metrics").text)
    classes = {dict(labels).get("request_class") for (name, labels) in metrics if name == "lookahead_requests_total"}
    assert classes == {"first", "other"}


def test_opt_in_ngram_cache_per_class_persists_and_stays_lossless(tiny: Any, tmp_path: Any) -> None:
    # "code" opts in to the cross-request n-gram cache; "chat" does not. The cache fills from finished
    # code responses (its size shows in /metrics), never changes a token, and is saved at shutdown
    # and loaded by the next server.
    from lookahead.candidates.ngram_cache import NGramCaches

    path = tmp_path / "caches.json"
    config = ServerConfig(policy=POLICY, ngram_cache_classes=("code",), ngram_cache_file=str(path), adaptive=False)
    reference = lookahead.generate(tiny, CHAT, max_new_tokens=16, strategy="autoregressive").text
    with serve(tiny, config) as server:
        client = server.openai()
        with server.http() as http:
            assert value(samples(http.get("/metrics").text), "lookahead_ngram_cache_entries", request_class="code") == 0
            for cls in ("code", "code", "chat"):
                reply = client.chat.completions.create(
                    model=MODEL, messages=CHAT, max_tokens=16, temperature=0, metadata={"request_class": cls}
                )
                assert reply.choices[0].message.content == reference
                if cls == "code":  # lossless with guesses accepted, not by never speculating
                    assert reply.usage.completion_tokens > reply.usage.model_extra["lookahead"]["steps"]
            after = samples(http.get("/metrics").text)
    entries = value(after, "lookahead_ngram_cache_entries", request_class="code")
    assert entries > 0 and value(after, "lookahead_ngram_cache_bytes", request_class="code") > 0
    assert ("lookahead_ngram_cache_entries", (("request_class", "chat"),)) not in after
    saved = NGramCaches.load(path)
    assert saved.classes == ("code",) and len(saved.get("code") or ()) == entries
    assert path.stat().st_mode & 0o777 == 0o600  # pieces of users' responses: owner-only
    with serve(tiny, config) as server, server.http() as http:
        loaded = samples(http.get("/metrics").text)
        assert value(loaded, "lookahead_ngram_cache_entries", request_class="code") == entries
    # The flag, not the file, decides who keeps a cache: code is dropped when only chat opts in.
    import dataclasses

    with serve(tiny, dataclasses.replace(config, ngram_cache_classes=("chat",))) as server, server.http() as http:
        only_chat = samples(http.get("/metrics").text)
        assert value(only_chat, "lookahead_ngram_cache_entries", request_class="chat") == 0
        assert ("lookahead_ngram_cache_entries", (("request_class", "code"),)) not in only_chat
    assert NGramCaches.load(path).classes == ("chat",)


def test_learned_file_carries_each_class_across_a_restart(tiny: Any, tmp_path: Any) -> None:
    # What a class's requests learned (calibrated acceptance, recycled successors) is saved at shutdown
    # and is where the next server starts: /v1/policy shows the code class's calibration before any
    # request. Tokens are the model's either way.
    import json

    path = tmp_path / "learned.json"
    config = ServerConfig(policy=POLICY, learned_file=str(path), adaptive=False)
    reference = lookahead.generate(tiny, CHAT, max_new_tokens=16, strategy="autoregressive").text
    with serve(tiny, config) as server, server.http() as http:
        assert http.get("/v1/policy").json()["calibration"] == {}
        for _ in range(2):
            reply = server.openai().chat.completions.create(
                model=MODEL, messages=CHAT, max_tokens=16, temperature=0, metadata={"request_class": "code"})
            assert reply.choices[0].message.content == reference
        learned = http.get("/v1/policy").json()["calibration"]["code"]
    saved = json.loads(path.read_text())
    assert path.stat().st_mode & 0o777 == 0o600  # statistics of users' text: owner-only
    assert set(saved["labels"]) == {"code"} and set(saved["labels"]["code"]) == {"calibrator", "successors"}
    with serve(tiny, config) as server, server.http() as http:
        assert http.get("/v1/policy").json()["calibration"] == {"code": learned}
        restored = server.app.state.worker.learned()["code"]["successors"]
        assert restored.to_json()["adj"] == saved["labels"]["code"]["successors"]["adj"] != []
        reply = server.openai().chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=16, temperature=0, metadata={"request_class": "code"})
        assert reply.choices[0].message.content == reference
