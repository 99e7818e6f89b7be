"""Strategy labels of `lookahead bench --strategies`: a strategy name, optionally followed by
parameters after slashes, so one run can compare shapes of the same strategy side by side.

    autoregressive                    the baseline (no parameters)
    lookahead                         hybrid pool, with the run's --lookahead W,N,G
    lookahead/W=4/N=4/G=2             its own shape (also window=, ngram=, guesses=, context_tokens=)
    lookahead/cache                   plus a cross-request n-gram cache per request class
    lookahead/sources=suffix+recycle  its own free sources (names in candidates/registry.py)
    lookahead_jacobi                  Jacobi n-grams only (the original algorithm's pool)
    prompt_lookup/max_ngram=4/num_tokens=10/max_candidates=2/cache
    speculative/draft=self:24/k=4     a self-draft of 24 target layers proposing 4 tokens
    autoregressive/unpadded           any engine strategy run unpadded (exact=False): the fastest
                                      plain path, identical to the others only up to float rounding
    lookahead/whole                   any engine strategy prefilling every prompt whole (no prefix
                                      cache: engine/prefix_cache.py), as transformers' generate() does
    hf_generate, hf_prompt_lookup     transformers' own generate() (no parameters)

The label, exactly as written, names the strategy's rows in results.jsonl and summary.json; the
recommended policy turns it back into the server's {"strategy": ..., block: {...}} form.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from lookahead.config import LookaheadConfig, PromptLookupConfig, SpeculativeConfig
from lookahead.errors import ConfigError
from lookahead.policy import STRATEGY_BLOCK, Decision

CACHE_FLAG = "cache"
UNPADDED_FLAG = "unpadded"
WHOLE_FLAG = "whole"
CACHED_STRATEGIES = ("lookahead", "prompt_lookup")  # the engine offers cross-request n-grams to these

# Per parameter block: accepted key -> config field.
_KEYS: dict[str, dict[str, str]] = {
    "lookahead": {"W": "window", "N": "ngram", "G": "guesses", "window": "window", "ngram": "ngram",
                  "guesses": "guesses", "context_tokens": "context_tokens", "sources": "sources"},
    "prompt_lookup": {f.name: f.name for f in dataclasses.fields(PromptLookupConfig)},
    "speculative": {"draft": "draft", "k": "draft_tokens", "draft_tokens": "draft_tokens"},
}
_CONFIGS: dict[str, type] = {"lookahead": LookaheadConfig, "prompt_lookup": PromptLookupConfig,
                             "speculative": SpeculativeConfig}


@dataclass(frozen=True)
class StrategySpec:
    """One parsed label. For "lookahead"/"lookahead_jacobi" the label's W/N/G (`lookahead_overrides`)
    replace those fields of the run's --lookahead shape; other blocks get a full `config`."""

    label: str
    strategy: str
    config: PromptLookupConfig | SpeculativeConfig | None = None
    lookahead_overrides: tuple[tuple[str, Any], ...] = ()
    ngram_cache: bool = False
    exact: bool = True  # False: the label's /unpadded (engine passes not padded to the width floor)
    prefix_cache: bool = True  # False: the label's /whole (every prompt prefilled whole)

    def lookahead_or(self, default: LookaheadConfig) -> LookaheadConfig:
        """The run's shape with this label's own W/N/G (and context_tokens), if any."""
        return dataclasses.replace(default, **dict(self.lookahead_overrides)) if self.lookahead_overrides else default

    def decision(self, default_lookahead: LookaheadConfig) -> Decision:
        """The lookahead.policy form of this strategy (the cross-request cache is a deployment choice,
        not part of the policy format)."""
        block = STRATEGY_BLOCK.get(self.strategy)
        if block == "lookahead":
            return Decision(self.strategy, self.lookahead_or(default_lookahead))
        return Decision(self.strategy, self.config if block else None)


def _segments(label: str) -> list[str]:
    """Split on '/', but keep slashes inside a value: 'speculative/draft=Org/Model/k=2' ->
    ['speculative', 'draft=Org/Model', 'k=2'] (a segment that is neither key=value nor 'cache'
    continues the value before it)."""
    name, *rest = label.split("/")
    out = [name.strip()]
    for seg in rest:
        flag = seg.strip() in (CACHE_FLAG, UNPADDED_FLAG, WHOLE_FLAG)
        starts_new = flag or re.match(r"^\s*[A-Za-z_]+=", seg) is not None
        if starts_new or len(out) == 1 or "=" not in out[-1]:
            out.append(seg.strip())
        else:
            out[-1] += "/" + seg
    return out


def parse_strategy(label: str, known: tuple[str, ...]) -> StrategySpec:
    """'speculative/draft=self:24/k=4' -> StrategySpec. Errors name the label and what to write."""
    name, *params = _segments(label)
    if name not in known:
        where = f" in {label!r}" if label != name else ""
        raise ConfigError(f"unknown strategy {name}{where}; choose from {', '.join(known)}")
    block = STRATEGY_BLOCK.get(name)
    exact, prefix = UNPADDED_FLAG not in params, WHOLE_FLAG not in params
    for flag, off in ((UNPADDED_FLAG, not exact), (WHOLE_FLAG, not prefix)):
        if off and name.startswith("hf_"):
            raise ConfigError(f"{label!r}: /{flag} applies to the engine's strategies, not transformers' generate()")
    params = [p for p in params if p not in (UNPADDED_FLAG, WHOLE_FLAG)]
    if params and block is None and params != [CACHE_FLAG]:
        raise ConfigError(f"strategy {name!r} takes no parameters; write just {name!r}")
    cache = False
    values: dict[str, Any] = {}
    for p in params:
        if p == CACHE_FLAG:
            if name not in CACHED_STRATEGIES:
                raise ConfigError(f"{label!r}: the cross-request n-gram cache is offered to "
                                  f"{' and '.join(CACHED_STRATEGIES)} only")
            cache = True
            continue
        key, sep, raw = p.partition("=")
        keys = _KEYS[block] if block else {}
        if not sep or key not in keys:
            raise ConfigError(f"{label!r}: cannot read {p!r}; {name} takes "
                              f"{', '.join(k + '=...' for k in keys)}" + (" or /cache" if name in CACHED_STRATEGIES else ""))
        field_name = keys[key]
        if field_name == "draft":
            values[field_name] = raw.strip()
        elif field_name == "sources":
            values[field_name] = _sources(raw, label)
        else:
            values[field_name] = _int(raw, label, key)
    if block == "lookahead":
        LookaheadConfig(**values)  # range errors now, at the edge (the run's shape is applied later)
        return StrategySpec(label=label, strategy=name, lookahead_overrides=tuple(sorted(values.items())),
                            ngram_cache=cache, exact=exact, prefix_cache=prefix)
    config = _CONFIGS[block](**values) if block else None  # the config validates ranges
    return StrategySpec(label=label, strategy=name, config=config, ngram_cache=cache, exact=exact, prefix_cache=prefix)


def parse_strategies(labels: tuple[str, ...], known: tuple[str, ...]) -> dict[str, StrategySpec]:
    return {label: parse_strategy(label, known) for label in labels}


def _sources(raw: str, label: str) -> tuple[str, ...]:
    """'suffix+recycle' -> ('suffix', 'recycle'), each a source the registry knows."""
    from lookahead.candidates.registry import source_names  # here: the registry pulls in the model stack

    known = source_names()
    names = tuple(n.strip() for n in raw.split("+") if n.strip())
    unknown = [n for n in names if n not in known]
    if not names or unknown:
        raise ConfigError(f"{label!r}: sources takes names joined by '+' from {', '.join(known)}"
                          + (f"; unknown: {', '.join(unknown)}" if unknown else ""))
    return names


def _int(raw: str, label: str, key: str) -> int:
    if not raw.strip().lstrip("-").isdigit():
        raise ConfigError(f"{label!r}: {key} takes an integer, got {raw!r}")
    return int(raw)
