"""What only the operator decides (issue 14, items 7, 9-11): draft models checked at start, the cap on
clients' decoding overrides, n-gram caches bound to API keys, no server paths shown, uvicorn's
connection limit, and the tokenizer shared by threads without a lock."""

from __future__ import annotations

import argparse
import dataclasses
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import openai
import pytest

import lookahead
from lookahead.config import LookaheadConfig, SpeculativeConfig
from lookahead.errors import ConfigError
from lookahead.models.loader import LoadedModel
from lookahead.policy import Decision, Policy
from lookahead.server import ServerConfig, create_app
from lookahead.server import cli
from lookahead.server.cli import config_from_args, register, serve_command, uvicorn_config
from lookahead.server.startup import load_api_keys
from lookahead.testing import tiny_model

from .live import CHAT, GatedStream, Live, free_port, serve
from .test_metrics_policy import samples, value
from .test_worker_edges import start_held_stream

MODEL = "tiny-llama"
POLICY = Policy(
    default=Decision("lookahead"),
    classes={
        # 1 + 3*2 + 2*2 = 11 query tokens a step (candidates of N-1 tokens: context_tokens=None)
        "code": Decision("lookahead", LookaheadConfig(window=3, ngram=3, guesses=2, context_tokens=None)),
        "chat": Decision("autoregressive"),  # 1
    },
)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="lookahead")
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["serve", *argv])


def ask(client: openai.OpenAI, cls: str | None = None, lookahead: dict[str, Any] | None = None, **kw: Any) -> Any:
    extra: dict[str, Any] = {"extra_body": {"lookahead": lookahead}} if lookahead is not None else {}
    if cls is not None:
        extra["extra_headers"] = {"X-Request-Class": cls}
    kw.setdefault("max_tokens", 8)
    return client.chat.completions.create(model=MODEL, messages=CHAT, temperature=0, **extra, **kw)


def refused(client: openai.OpenAI, cls: str | None, lookahead: dict[str, Any]) -> dict[str, Any]:
    with pytest.raises(openai.BadRequestError) as err:
        ask(client, cls, lookahead)
    return dict(err.value.response.json()["error"])


# -- item 7: draft models are loaded and checked at start ------------------------------------------------


def draft_policy(draft: str) -> Policy:
    return Policy(classes={"docs": Decision("speculative", SpeculativeConfig(draft=draft, draft_tokens=3))})


def test_a_bad_draft_stops_create_app(tiny: Any) -> None:
    with pytest.raises(ConfigError, match=r"policy classes\.docs: draft model '/nonexistent/draft' cannot be used"):
        create_app(tiny, ServerConfig(policy=draft_policy("/nonexistent/draft")))


def test_a_bad_draft_stops_serve_with_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps(draft_policy("/nonexistent/draft").to_dict()))
    served: list[Any] = []
    monkeypatch.setattr(cli, "run", lambda *a, **k: served.append(a))  # never serve in a test
    argv = ("--port", str(free_port()), "--model", "tiny:llama", "--policy", str(policy))
    assert serve_command(parse(*argv)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert served == [] and len(err) == 1 and err[0].startswith("error: policy classes.docs: draft model"), err


def test_a_draft_folder_is_preloaded_and_its_path_never_shown(tiny: Any, tmp_path: Path) -> None:
    folder = tmp_path / "my-draft"
    tiny.model.save_pretrained(folder)  # the same weights: every guess of this draft is accepted
    tiny.tokenizer.save_pretrained(folder)
    calls: list[dict[str, Any]] = []

    def recording(*args: Any, **kwargs: Any) -> Iterator[Any]:
        calls.append(kwargs)
        return lookahead.stream_events(*args, **kwargs)

    with serve(tiny, ServerConfig(policy=draft_policy(str(folder)), adaptive=False), stream_fn=recording) as server:
        reply = ask(server.openai(), "docs")
        with server.http() as http:
            shown = http.get("/v1/policy").text
    assert reply.usage.model_extra["lookahead"]["strategy"] == "speculative"
    assert reply.usage.completion_tokens > reply.usage.model_extra["lookahead"]["steps"]  # guesses accepted
    assert isinstance(calls[0]["draft"], LoadedModel)  # loaded at start, handed to the engine
    assert str(tmp_path) not in shown and json.loads(shown)["policy"]["classes"]["docs"]["speculative"]["draft"] == "my-draft"


# -- item 9: --client-overrides off|capped|on ---------------------------------------------------------


@pytest.fixture(scope="module")
def capped(tiny: Any) -> Iterator[Live]:
    with serve(tiny, ServerConfig(policy=POLICY)) as server:  # the default: capped
        yield server


def test_capped_overrides_may_not_exceed_the_policys_step(capped: Live) -> None:
    client = capped.openai()
    error = refused(client, "code", {"window": 8})
    assert error["code"] == "override_too_large" and error["param"] == "lookahead"
    assert "limit of 11" in error["message"] and "--client-overrides" in error["message"]
    assert "limit of 1 " in refused(client, "chat", {"enabled": True})["message"]  # the policy runs autoregressive
    # the default W=1 N=4 G=4 context_tokens=11: 1 + 1*3 + 4*11 = 48; context_tokens 12 asks for 52
    assert "limit of 48" in refused(client, None, {"context_tokens": 12})["message"]
    smaller = ask(client, "code", {"window": 2})  # 1 + 2*2 + 2*2 = 9 <= 11
    assert smaller.usage.model_extra["lookahead"]["strategy"] == "lookahead"
    assert ask(client, "code", {"enabled": False}).usage.model_extra["lookahead"]["strategy"] == "autoregressive"
    metrics = samples(capped.http().get("/metrics").text)
    assert value(metrics, "lookahead_rejected_requests_total", request_class="code", reason="override_too_large") == 1


def test_overrides_off_and_on(tiny: Any) -> None:
    with serve(tiny, ServerConfig(policy=POLICY, client_overrides="off")) as server:
        client = server.openai()
        error = refused(client, "code", {"enabled": False})
        assert error["code"] == "override_not_allowed" and "--client-overrides off" in error["message"]
        assert ask(client, "code", {}).usage.model_extra["lookahead"]["strategy"] == "lookahead"  # nothing asked
    with serve(tiny, ServerConfig(policy=POLICY, client_overrides="on")) as server:
        reply = ask(server.openai(), "chat", {"window": 8, "guesses": 8})
        assert reply.usage.model_extra["lookahead"]["strategy"] == "lookahead"


def test_client_overrides_flag() -> None:
    assert config_from_args(parse()).client_overrides == "capped"
    assert config_from_args(parse("--client-overrides", "off")).client_overrides == "off"
    with pytest.raises(ConfigError, match="client overrides must be one of off, capped, on"):
        ServerConfig(client_overrides="sometimes")


# -- item 10: n-gram cache classes are bound to API keys -------------------------------------------------


def test_api_key_file(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# team keys\nsk-a  code,json\n\nsk-b\nsk-ops *\n")
    assert load_api_keys(str(keys)) == (("sk-a", ("code", "json")), ("sk-b", ()), ("sk-ops", ("*",)))
    for text, fragment in [
        ("sk-secret code json\n", "keys:1: write KEY or KEY CLASS"),
        ("sk-secret co/de\n", "'co/de' is not a class name"),
        ("sk-secret\nsk-secret code\n", "keys:2: this key is already listed"),
        ("# nothing\n", "lists no key"),
    ]:
        keys.write_text(text)
        with pytest.raises(ConfigError, match=fragment) as err:
            load_api_keys(str(keys))
        assert "sk-secret" not in str(err.value)  # errors never echo a key
    keys.write_text("sk-a code\n")
    config = config_from_args(parse("--api-keys", str(keys), "--api-key", "k"))
    assert config.key_classes() == {"sk-a": frozenset({"code"}), "k": frozenset({"*"})}


def test_a_key_uses_only_the_caches_of_its_classes(tiny: Any) -> None:
    used: list[bool] = []
    tables: list[Any] = []

    def recording(*args: Any, **kwargs: Any) -> Iterator[Any]:
        used.append("ngram_cache" in kwargs)
        tables.append(kwargs.get("successors"))  # the class's recycled successors hold its text too
        return lookahead.stream_events(*args, **kwargs)

    config = ServerConfig(
        api_key="sk-ops", api_keys=(("sk-a", ("code",)), ("sk-b", ())), ngram_cache_classes=("code",), adaptive=False
    )
    with serve(tiny, config, stream_fn=recording) as server:
        entries = []
        for key in ("sk-b", "sk-a", "sk-ops"):
            assert ask(server.openai(api_key=key), "code").usage.completion_tokens == 8  # all are served
            with server.http(headers={"Authorization": "Bearer sk-ops"}) as http:
                entries.append(value(samples(http.get("/metrics").text), "lookahead_ngram_cache_entries", request_class="code"))
    assert used == [False, True, True]  # sk-b is not bound to "code": no cache read, none written
    assert tables[0] is None and tables[1] is not None and tables[2] is tables[1]  # ... and its own successors
    assert entries[0] == 0 and entries[1] > 0


# -- item 11: no server paths, a policy text from the config, a connection limit, the tokenizer -----------


def test_policy_source_is_the_file_name_only(tmp_path: Path, tiny: Any) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(POLICY.to_dict()))
    config = config_from_args(parse("--policy", str(path.resolve())))
    assert config.policy_source == "p.json"
    with serve(tiny, config) as server, server.http() as http:
        assert http.get("/v1/policy").json()["source"] == "p.json"


def test_builtin_policy_text_follows_the_engine_default() -> None:
    c = LookaheadConfig()
    shape = f"W={c.window} N={c.ngram} G={c.guesses}"
    assert ServerConfig().policy_source == f"built-in default (lookahead, {shape}, for every request)"
    assert ServerConfig(policy=POLICY).policy_source == "set in code"


def test_connections_past_the_limit_get_503(tiny: Any) -> None:
    assert parse().max_connections == 128
    assert uvicorn_config(None, config_from_args(parse("--max-connections", "7"))).limit_concurrency == 7
    gate = GatedStream()
    with serve(tiny, ServerConfig(max_connections=2), stream_fn=gate) as server:
        http, stream, _ = start_held_stream(server, gate)  # connection 1 of 2, held open
        with server.http() as other:  # connection 2 reaches the limit
            assert other.get("/health").status_code == 503
        gate.open()
        stream.__exit__(None, None, None)
        http.close()


class Spy:
    """Stands in for a fast tokenizer's Rust backend; records calls that change its state."""

    MUTATORS = frozenset({"enable_truncation", "no_truncation", "enable_padding", "no_padding", "add_tokens",
                          "add_special_tokens"})

    def __init__(self, backend: Any) -> None:
        object.__setattr__(self, "_backend", backend)
        object.__setattr__(self, "changes", [])

    def __getattr__(self, name: str) -> Any:
        if name in Spy.MUTATORS:
            self.changes.append(name)
        return getattr(self._backend, name)

    def __setattr__(self, name: str, value: Any) -> None:
        self.changes.append(f"set {name}")
        setattr(self._backend, name, value)


def test_encoding_and_decoding_never_change_the_shared_tokenizer() -> None:
    # Why no lock is needed: once settled at start, no encode or decode changes the tokenizer's state,
    # so threads only ever share it read-only. A saved tokenizer may come with truncation switched on.
    loaded = tiny_model("llama")
    loaded.tokenizer.backend_tokenizer.enable_truncation(512)
    with serve(loaded, ServerConfig(adaptive=False)) as server:  # create_app settles the tokenizer
        spy = Spy(loaded.tokenizer._tokenizer)
        loaded.tokenizer._tokenizer = spy
        client = server.openai()
        ask(client, stop=["e"])
        list(ask(client, stream=True))
        client.completions.create(model=MODEL, prompt="def f(x):", max_tokens=8, temperature=0)
        client.completions.create(model=MODEL, prompt=[40, 41, 42], max_tokens=8, temperature=0)
    assert spy.changes == []


class BarrierModel(LoadedModel):
    """The tiny model whose encode() waits until `parties` requests are encoding at the same time."""

    barrier: ClassVar[threading.Barrier | None] = None

    def encode(self, prompt: Any, *, raw: bool = False) -> list[int]:
        token_ids = isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)  # the worker's call
        if BarrierModel.barrier is not None and not token_ids:
            BarrierModel.barrier.wait(timeout=60)  # only a failing run waits this long
        return super().encode(prompt, raw=raw)


def test_requests_encode_concurrently(tiny: Any) -> None:
    model = BarrierModel(**{f.name: getattr(tiny, f.name) for f in dataclasses.fields(tiny)})
    with serve(model, ServerConfig()) as server:
        BarrierModel.barrier = threading.Barrier(2)
        try:
            results: list[Any] = ["never answered", "never answered"]

            def one(i: int) -> None:
                try:
                    results[i] = ask(server.openai(), max_tokens=2).usage.completion_tokens
                except openai.APIError as exc:  # reported below
                    results[i] = exc

            threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            BarrierModel.barrier = None
    assert results == [2, 2]
