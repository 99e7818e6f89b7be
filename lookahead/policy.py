"""Per-class decoding policy: which strategy, with which parameters, serves which kind of request.

The file format (JSON, or YAML for a .yaml/.yml path) is the one the benchmark's cost report writes
as its recommendation, so report -> policy -> server is one step:

    {"version": 1,
     "default": {"strategy": "lookahead", "lookahead": {"window": 4, "ngram": 4, "guesses": 4}},
     "classes": {"code": {"strategy": "lookahead", "lookahead": {"window": 8, "ngram": 4, "guesses": 8}},
                 "chat": {"strategy": "autoregressive"}},
     "rules": [{"if": {"max_tokens_below": 32}, "strategy": "autoregressive"}],
     "meta": {"...": "free-form, kept as is (e.g. what the recommendation was measured on)"}}

Resolution order for one request: the first rule whose every condition holds, else the entry of the
request's class, else the default. Rule conditions: `max_tokens_below` (int), `max_tokens_at_least`
(int), `class` (a name or a list of names). Every strategy of lookahead.config.STRATEGIES is allowed;
its parameters go in the block STRATEGY_BLOCK names: "lookahead" (lookahead, lookahead_jacobi),
"prompt_lookup", "speculative" (e.g. {"strategy": "speculative", "speculative": {"draft": "self:8",
"draft_tokens": 4}}).

The server (`lookahead serve --policy`) reads this format and the benchmark (`lookahead bench`) writes
it; neither owns it. This module only depends on the standard library, lookahead.config and
lookahead.errors (PyYAML is imported for YAML files only), so either side, or an operator's tooling,
can write and validate policies without the server's or the engine's dependencies.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from lookahead.config import STRATEGIES, LookaheadConfig, PromptLookupConfig, SpeculativeConfig, is_int
from lookahead.errors import ConfigError

POLICY_VERSION = 1
_TOP_KEYS = ("version", "default", "classes", "rules", "meta")
_CONDITIONS = ("max_tokens_below", "max_tokens_at_least", "class")
# A parameter block's name is also its keyword in lookahead.stream_events and its GenerationConfig field.
_BLOCKS: dict[str, type] = {
    "lookahead": LookaheadConfig,
    "prompt_lookup": PromptLookupConfig,
    "speculative": SpeculativeConfig,
}
STRATEGY_BLOCK: dict[str, str] = {  # strategies not listed take no parameters
    "lookahead": "lookahead",
    "lookahead_jacobi": "lookahead",
    "prompt_lookup": "prompt_lookup",
    "speculative": "speculative",
}
_DECISION_KEYS = ("strategy", *_BLOCKS)
# advanced knobs, written only when not default
_WRITTEN_IF_CHANGED = {"context_ngrams", "max_pool_per_key", "context_tokens", "sources", "hidden_states"}
_NULLABLE = {"context_tokens"}  # null means "N-1 tokens", not the default


class PolicyError(ConfigError):
    """A policy file is missing, unreadable or malformed; the message names the file and the field."""


@dataclass(frozen=True)
class Decision:
    """A strategy and its parameters: a LookaheadConfig for "lookahead"/"lookahead_jacobi", a
    PromptLookupConfig for "prompt_lookup", a SpeculativeConfig for "speculative", None otherwise
    (missing parameters get the config's defaults)."""

    strategy: str
    config: Any = None

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"unknown strategy {self.strategy!r}; choose one of {', '.join(STRATEGIES)}")
        block = self.block
        if block is None:
            if self.config is not None:
                raise ConfigError(f"strategy {self.strategy!r} takes no parameters; remove them or change the strategy")
            return
        kind = _BLOCKS[block]
        if self.config is None:
            object.__setattr__(self, "config", kind())
        elif not isinstance(self.config, kind):
            raise ConfigError(f"strategy {self.strategy!r} takes {kind.__name__} parameters, not {self.config!r}")

    @property
    def block(self) -> str | None:
        """The name of this strategy's parameter block ("lookahead", "prompt_lookup", ...), if any."""
        return STRATEGY_BLOCK.get(self.strategy)

    @property
    def lookahead(self) -> LookaheadConfig | None:
        return self.config if isinstance(self.config, LookaheadConfig) else None

    @property
    def query_tokens(self) -> int:
        """Upper bound on the query tokens one decoding step of this decision feeds the target model
        (the root included): what an operator's choice costs per step, and what caps a request's own
        override (`--client-overrides capped`)."""
        cfg = self.config
        if isinstance(cfg, LookaheadConfig):
            if self.strategy == "lookahead_jacobi":  # the engine runs it without context n-grams
                cfg = dataclasses.replace(cfg, context_ngrams=False)
            return cfg.query_tokens
        if isinstance(cfg, PromptLookupConfig):
            return 1 + cfg.num_tokens * cfg.max_candidates
        if isinstance(cfg, SpeculativeConfig):
            return 1 + cfg.draft_tokens
        return 1

    def describe(self) -> str:
        """A short text, e.g. "lookahead, W=2 N=4 G=4" or "speculative, draft=self:8 k=4"."""
        cfg = self.config
        if isinstance(cfg, LookaheadConfig):
            return f"{self.strategy}, W={cfg.window} N={cfg.ngram} G={cfg.guesses}"
        if isinstance(cfg, PromptLookupConfig):
            return f"{self.strategy}, {cfg.max_candidates} candidates x {cfg.num_tokens} tokens"
        if isinstance(cfg, SpeculativeConfig):
            return f"{self.strategy}, k={cfg.draft_tokens}"
        return self.strategy

    def engine_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for lookahead.stream_events besides `strategy`."""
        return {} if self.block is None else {self.block: self.config}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"strategy": self.strategy}
        if self.block is not None:
            defaults = _BLOCKS[self.block]()
            out[self.block] = {
                f.name: _plain(getattr(self.config, f.name))
                for f in dataclasses.fields(self.config)
                if f.name not in _WRITTEN_IF_CHANGED or getattr(self.config, f.name) != getattr(defaults, f.name)
            }
        return out


@dataclass(frozen=True)
class Rule:
    """A decision that applies when every given condition holds (at least one must be given)."""

    decision: Decision
    max_tokens_below: int | None = None
    max_tokens_at_least: int | None = None
    classes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_tokens_below is None and self.max_tokens_at_least is None and not self.classes:
            raise ConfigError(
                "a rule needs at least one condition "
                f"({', '.join(_CONDITIONS)}); to change what unlabelled traffic gets, edit 'default'"
            )
        for name in ("max_tokens_below", "max_tokens_at_least"):
            value = getattr(self, name)
            if value is not None and (not is_int(value) or value < 1):
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")

    def matches(self, request_class: str | None, max_tokens: int) -> bool:
        if self.max_tokens_below is not None and not max_tokens < self.max_tokens_below:
            return False
        if self.max_tokens_at_least is not None and not max_tokens >= self.max_tokens_at_least:
            return False
        return not self.classes or request_class in self.classes

    def to_dict(self) -> dict[str, Any]:
        cond: dict[str, Any] = {}
        if self.max_tokens_below is not None:
            cond["max_tokens_below"] = self.max_tokens_below
        if self.max_tokens_at_least is not None:
            cond["max_tokens_at_least"] = self.max_tokens_at_least
        if self.classes:
            cond["class"] = self.classes[0] if len(self.classes) == 1 else list(self.classes)
        return {"if": cond, **self.decision.to_dict()}


@dataclass(frozen=True)
class Policy:
    """Maps a request (its class and max_tokens) to a decoding strategy. Immutable once built."""

    default: Decision = field(default_factory=lambda: Decision("lookahead"))
    classes: Mapping[str, Decision] = field(default_factory=dict)
    rules: tuple[Rule, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "classes", MappingProxyType(dict(self.classes)))
        object.__setattr__(self, "rules", tuple(self.rules))
        object.__setattr__(self, "meta", MappingProxyType(dict(self.meta)))
        for name in self.classes:
            if not isinstance(name, str) or not name:
                raise ConfigError(f"class names must be non-empty strings, got {name!r}")

    def decide(self, request_class: str | None, max_tokens: int) -> Decision:
        for rule in self.rules:
            if rule.matches(request_class, max_tokens):
                return rule.decision
        if request_class is not None and request_class in self.classes:
            return self.classes[request_class]
        return self.default

    def choose(self, request_class: str | None, max_tokens: int) -> tuple[str, LookaheadConfig | None]:
        """(strategy, LookaheadConfig or None) for a request of this class asking for max_tokens."""
        decision = self.decide(request_class, max_tokens)
        return decision.strategy, decision.lookahead

    def decisions(self) -> list[tuple[str, Decision]]:
        """Every decision with where it sits in the file ("default", "classes.code", "rules[0]")."""
        return [
            ("default", self.default),
            *((f"classes.{name}", d) for name, d in self.classes.items()),
            *((f"rules[{i}]", r.decision) for i, r in enumerate(self.rules)),
        ]

    def to_dict(self) -> dict[str, Any]:
        """The file format; `Policy.from_dict(p.to_dict()) == p`."""
        return {
            "version": POLICY_VERSION,
            "default": self.default.to_dict(),
            "classes": {name: d.to_dict() for name, d in self.classes.items()},
            "rules": [r.to_dict() for r in self.rules],
            "meta": _plain(self.meta),
        }

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "policy") -> Policy:
        """Validate a parsed policy document; errors name `source` and the offending field."""
        if not isinstance(data, dict):
            raise PolicyError(f"{source}: a policy must be a mapping (a JSON object), got {type(data).__name__}")
        _no_unknown_keys(data, _TOP_KEYS, source, "top level")
        version = data.get("version")
        if version != POLICY_VERSION:
            raise PolicyError(f"{source}: 'version' must be {POLICY_VERSION}, got {version!r}")
        if "default" not in data:
            raise PolicyError(f'{source}: \'default\' is missing; add e.g. {{"strategy": "lookahead"}}')
        default = _decision(data["default"], source, "default")
        classes_raw = data.get("classes", {})
        if not isinstance(classes_raw, dict):
            raise PolicyError(f"{source}: 'classes' must be a mapping of class name to decision")
        classes = {}
        for name, value in classes_raw.items():
            if not isinstance(name, str) or not name:
                raise PolicyError(f"{source}: classes: class names must be non-empty strings, got {name!r}")
            classes[name] = _decision(value, source, f"classes.{name}")
        rules_raw = data.get("rules", [])
        if not isinstance(rules_raw, list):
            raise PolicyError(f"{source}: 'rules' must be a list")
        rules = tuple(_rule(value, source, f"rules[{i}]") for i, value in enumerate(rules_raw))
        meta = data.get("meta", {})
        if not isinstance(meta, dict):
            raise PolicyError(f"{source}: 'meta' must be a mapping")
        return cls(default=default, classes=classes, rules=rules, meta=meta)


DEFAULT_POLICY = Policy()


def load_policy(path: str | Path) -> Policy:
    """Read and validate a policy file (.json, or .yaml/.yml). Raises PolicyError with the reason."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PolicyError(f"policy file {str(p)!r} does not exist; check the path given to --policy") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(f"cannot read policy file {str(p)!r}: {exc}") from None
    return Policy.from_dict(_parse(text, p), source=str(p))


def dump_policy(policy: Policy, path: str | Path) -> None:
    """Write a policy in the file format (YAML for .yaml/.yml, JSON otherwise)."""
    p = Path(path)
    data = policy.to_dict()
    if p.suffix.lower() in (".yaml", ".yml"):
        import yaml

        p.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    else:
        p.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def _parse(text: str, path: Path) -> Any:
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise PolicyError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise PolicyError(
            f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
            "name the file .yaml or .yml for YAML"
        ) from None


def _decision(value: Any, source: str, where: str) -> Decision:
    if not isinstance(value, dict):
        raise PolicyError(f'{source}: {where}: must be a mapping like {{"strategy": "lookahead"}}')
    _no_unknown_keys(value, _DECISION_KEYS, source, where)
    strategy = value.get("strategy")
    if strategy is None:
        raise PolicyError(f"{source}: {where}: 'strategy' is missing; choose one of {', '.join(STRATEGIES)}")
    if strategy not in STRATEGIES:
        raise PolicyError(f"{source}: {where}: unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    block = STRATEGY_BLOCK.get(strategy)
    given = [k for k in _BLOCKS if k in value]
    for name in given:
        if name != block:
            uses = f"its parameters go under {block!r}" if block else "it takes no parameters"
            raise PolicyError(f"{source}: {where}: {name!r} parameters do not apply to strategy {strategy!r} ({uses})")
    config = None
    if block is not None and block in value:
        config = _block(value[block], _BLOCKS[block], source, f"{where}.{block}")
    return Decision(strategy=strategy, config=config)


def _block(params: Any, kind: type, source: str, where: str) -> Any:
    """One parameter block, e.g. {"window": 4, "ngram": 4}, as an instance of its config dataclass."""
    defaults = kind()
    names = tuple(f.name for f in dataclasses.fields(kind))
    if not isinstance(params, dict):
        raise PolicyError(f"{source}: {where}: must be a mapping like {{{names[0]!r}: ...}}")
    _no_unknown_keys(params, names, source, where)
    for key, v in params.items():
        default = getattr(defaults, key)
        expected = int if default is None else type(default)  # optional knobs (context_tokens) are integers
        if expected is tuple:  # a list of names in JSON/YAML (e.g. lookahead.sources)
            ok = isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v)
            if ok:
                params = {**params, key: tuple(v)}
                continue
            raise PolicyError(f"{source}: {where}.{key}: must be a list of names, got {v!r}")
        ok = isinstance(v, bool) if expected is bool else isinstance(v, expected) and not isinstance(v, bool)
        ok = ok or (v is None and (default is None or key in _NULLABLE))
        if not ok:
            kind_name = {bool: "true or false", int: "an integer", str: "a string"}.get(expected, expected.__name__)
            raise PolicyError(f"{source}: {where}.{key}: must be {kind_name}, got {v!r}")
    try:
        return kind(**params)
    except ConfigError as exc:
        raise PolicyError(f"{source}: {where}: {exc}") from None


def _rule(value: Any, source: str, where: str) -> Rule:
    if not isinstance(value, dict):
        raise PolicyError(f'{source}: {where}: must be a mapping like {{"if": {{...}}, "strategy": ...}}')
    _no_unknown_keys(value, ("if", *_DECISION_KEYS), source, where)
    cond = value.get("if")
    if not isinstance(cond, dict) or not cond:
        raise PolicyError(
            f"{source}: {where}: 'if' must be a non-empty mapping of conditions ({', '.join(_CONDITIONS)})"
        )
    _no_unknown_keys(cond, _CONDITIONS, source, f"{where}.if")
    classes = cond.get("class", ())
    if isinstance(classes, str):
        classes = (classes,)
    if not isinstance(classes, (list, tuple)) or not all(isinstance(c, str) and c for c in classes):
        raise PolicyError(f"{source}: {where}.if.class: must be a class name or a list of names")
    decision = _decision({k: v for k, v in value.items() if k != "if"}, source, where)
    try:
        return Rule(
            decision=decision,
            max_tokens_below=cond.get("max_tokens_below"),
            max_tokens_at_least=cond.get("max_tokens_at_least"),
            classes=tuple(classes),
        )
    except ConfigError as exc:
        raise PolicyError(f"{source}: {where}.if: {exc}") from None


def _no_unknown_keys(mapping: dict[Any, Any], allowed: tuple[str, ...], source: str, where: str) -> None:
    unknown = [k for k in mapping if k not in allowed]
    if unknown:
        raise PolicyError(f"{source}: {where}: unknown key {unknown[0]!r}; allowed keys: {', '.join(allowed)}")



def _plain(value: Any) -> Any:
    """Mapping proxies back to dicts, so to_dict() is JSON-serializable."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
