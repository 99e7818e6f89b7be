"""The policy file format: parsing, validation errors that name the field, resolution order, round trip."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lookahead.config import LookaheadConfig, PromptLookupConfig, SpeculativeConfig
from lookahead.policy import DEFAULT_POLICY, Decision, Policy, PolicyError, Rule, dump_policy, load_policy

EXAMPLE: dict[str, Any] = {
    "version": 1,
    "default": {"strategy": "lookahead", "lookahead": {"window": 4, "ngram": 4, "guesses": 4}},
    "classes": {
        "code": {"strategy": "lookahead", "lookahead": {"window": 8, "ngram": 5, "guesses": 6, "context_tokens": 8}},
        "chat": {"strategy": "autoregressive"},
        "extract": {
            "strategy": "prompt_lookup",
            "prompt_lookup": {"min_ngram": 2, "max_ngram": 4, "num_tokens": 6, "max_candidates": 3},
        },
        "docs": {"strategy": "speculative", "speculative": {"draft": "self:1", "draft_tokens": 3}},
        "paper": {"strategy": "lookahead_jacobi", "lookahead": {"window": 5, "ngram": 3, "guesses": 2}},
    },
    "rules": [
        {"if": {"max_tokens_below": 32}, "strategy": "autoregressive"},
        {
            "if": {"class": ["code", "sql"], "max_tokens_at_least": 512},
            "strategy": "lookahead",
            "lookahead": {"window": 2, "ngram": 3, "guesses": 1},
        },
    ],
    "meta": {"measured_on": "smollm2-135m-instruct, 2-core CPU", "tokens_per_s": {"code": 41.5}},
}


def test_resolution_order_rules_then_class_then_default() -> None:
    policy = Policy.from_dict(EXAMPLE)
    assert policy.choose(None, 100) == ("lookahead", LookaheadConfig(4, 4, 4))
    assert policy.choose("code", 100) == ("lookahead", LookaheadConfig(8, 5, 6, context_tokens=8))
    assert policy.choose("chat", 100) == ("autoregressive", None)
    assert policy.choose("unknown", 100) == ("lookahead", LookaheadConfig(4, 4, 4))
    assert policy.choose("code", 31) == ("autoregressive", None)  # first rule wins over the class
    assert policy.choose("code", 32) == ("lookahead", LookaheadConfig(8, 5, 6, context_tokens=8))
    assert policy.choose("sql", 600) == ("lookahead", LookaheadConfig(2, 3, 1))
    assert policy.choose("chat", 600) == ("autoregressive", None)
    assert policy.choose("paper", 100) == ("lookahead_jacobi", LookaheadConfig(5, 3, 2))
    extract = policy.decide("extract", 100)
    assert extract.strategy == "prompt_lookup" and extract.lookahead is None
    assert extract.engine_kwargs() == {"prompt_lookup": PromptLookupConfig(2, 4, 6, 3)}
    assert policy.decide("docs", 100).engine_kwargs() == {"speculative": SpeculativeConfig("self:1", 3)}
    assert policy.decide("chat", 100).engine_kwargs() == {}


@pytest.mark.parametrize("suffix", [".json", ".yaml", ".yml"])
def test_files_round_trip(tmp_path: Path, suffix: str) -> None:
    policy = Policy.from_dict(EXAMPLE)
    path = tmp_path / f"policy{suffix}"
    dump_policy(policy, path)
    loaded = load_policy(path)
    assert loaded == policy
    assert loaded.to_dict() == EXAMPLE
    assert dict(loaded.meta) == EXAMPLE["meta"]


def test_default_policy_is_lookahead_everywhere() -> None:
    assert DEFAULT_POLICY.choose("anything", 1) == ("lookahead", LookaheadConfig())
    assert Policy.from_dict(json.loads(json.dumps(DEFAULT_POLICY.to_dict()))) == DEFAULT_POLICY


def broken(**changes: Any) -> dict[str, Any]:
    data = json.loads(json.dumps(EXAMPLE))
    for dotted, value in changes.items():
        *path, last = dotted.split("__")
        node = data
        for key in path:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if value is ...:
            del node[last]
        else:
            node[last] = value
    return data


MALFORMED: list[tuple[Any, str]] = [
    ([1, 2], "must be a mapping"),
    (broken(version=2), "'version' must be 1"),
    (broken(version=...), "'version' must be 1"),
    (broken(default=...), "'default' is missing"),
    (broken(extra=1), "unknown key 'extra'"),
    (broken(default={"strategy": "jacobi"}), "unknown strategy 'jacobi'"),
    (broken(default={"lookahead": {"window": 4}}), "default: 'strategy' is missing"),
    (
        broken(classes__chat={"strategy": "autoregressive", "lookahead": {"window": 4}}),
        "classes.chat: 'lookahead' parameters do not apply to strategy 'autoregressive' (it takes no parameters)",
    ),
    (
        broken(classes__code={"strategy": "prompt_lookup", "lookahead": {"window": 4}}),
        "do not apply to strategy 'prompt_lookup' (its parameters go under 'prompt_lookup')",
    ),
    (broken(classes__extract__prompt_lookup={"min_ngram": 5, "max_ngram": 2}), "min_ngram (5) must be <= max_ngram"),
    (broken(classes__docs__speculative={"draft": 3}), "classes.docs.speculative.draft: must be a string"),
    (broken(classes__docs__speculative={"draft_tokens": 0}), "draft_tokens (k) must be an integer in [1, 64]"),
    (broken(classes__code__lookahead={"window": 0, "ngram": 4, "guesses": 4}), "classes.code.lookahead: window (W)"),
    (broken(classes__code__lookahead={"window": "8"}), "classes.code.lookahead.window: must be an integer"),
    (broken(classes__code__lookahead={"window": True}), "must be an integer"),
    (broken(classes__code__lookahead={"width": 8}), "classes.code.lookahead: unknown key 'width'"),
    (broken(classes__code__lookahead={"context_tokens": "8"}), "classes.code.lookahead.context_tokens: must be an integer"),
    (broken(classes__code__lookahead={"context_tokens": 0}), "context_tokens must be an integer >= 1"),
    (broken(classes__code__lookahead={"window": 100, "ngram": 8, "guesses": 100}), "512"),
    (broken(classes=[]), "'classes' must be a mapping"),
    (broken(classes={"": {"strategy": "autoregressive"}}), "non-empty strings"),
    (broken(rules={}), "'rules' must be a list"),
    (broken(rules__0__if={}), "rules[0]: 'if' must be a non-empty mapping"),
    (broken(rules__0__if={"max_token_below": 32}), "rules[0].if: unknown key 'max_token_below'"),
    (broken(rules__0__if={"max_tokens_below": 0}), "rules[0].if: max_tokens_below must be an integer >= 1"),
    (broken(rules__0__if={"max_tokens_below": "32"}), "max_tokens_below must be an integer"),
    (broken(rules__0__if={"class": 3}), "rules[0].if.class"),
    (broken(rules__0__strategy=...), "rules[0]: 'strategy' is missing"),
    (broken(meta=[1]), "'meta' must be a mapping"),
]


@pytest.mark.parametrize(("data", "fragment"), MALFORMED)
def test_malformed_policies_say_what_is_wrong(data: Any, fragment: str) -> None:
    with pytest.raises(PolicyError) as err:
        Policy.from_dict(data, source="p.json")
    assert str(err.value).startswith("p.json")
    assert fragment in str(err.value)


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="does not exist"):
        load_policy(tmp_path / "missing.json")
    bad_json = tmp_path / "p.json"
    bad_json.write_text('{"version": 1,')
    with pytest.raises(PolicyError, match=r"not valid JSON \(line 1"):
        load_policy(bad_json)
    bad_yaml = tmp_path / "p.yaml"
    bad_yaml.write_text("version: [1\n")
    with pytest.raises(PolicyError, match="not valid YAML"):
        load_policy(bad_yaml)
    scalar = tmp_path / "s.yaml"
    scalar.write_text("just text\n")
    with pytest.raises(PolicyError, match="must be a mapping"):
        load_policy(scalar)


def test_rule_needs_a_condition() -> None:
    with pytest.raises(Exception, match="at least one condition"):
        Rule(Decision("autoregressive"))


def test_policy_module_does_not_need_fastapi() -> None:
    import subprocess
    import sys

    code = "import sys; import lookahead.policy; assert 'fastapi' not in sys.modules, 'fastapi imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_reading_a_policy_does_not_load_torch() -> None:
    # The policy module is what operators' tooling imports to write or check a policy file; it must
    # not drag in torch and transformers (seconds of import and hundreds of MB) to do that.
    code = "import sys, lookahead.policy, lookahead.config; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
