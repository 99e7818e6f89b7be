"""Validated settings of one benchmark run, parsed from the command line at the edge."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lookahead.config import LookaheadConfig
from lookahead.errors import ConfigError

BASELINE = "autoregressive"
DEFAULT_PRICE_PER_HOUR = 1.0
BOOTSTRAP_RESAMPLES = 2000


def parse_csv(text: str, what: str) -> tuple[str, ...]:
    items = tuple(x.strip() for x in text.split(",") if x.strip())
    if not items:
        raise ConfigError(f"{what} is empty; give a comma-separated list")
    return items


def parse_wng(text: str) -> LookaheadConfig:
    """'W,N,G' -> LookaheadConfig."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 3 or not all(p.lstrip("-").isdigit() for p in parts):
        raise ConfigError(f"--lookahead takes three integers W,N,G (e.g. 4,4,4), got {text!r}")
    w, n, g = (int(p) for p in parts)
    return LookaheadConfig(window=w, ngram=n, guesses=g)


def parse_mix(text: str) -> dict[str, float]:
    """'code=0.3,chat=0.7' -> shares normalised to sum to 1."""
    shares: dict[str, float] = {}
    for item in parse_csv(text, "--mix"):
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"--mix items look like class=share, got {item!r}")
        try:
            v = float(value)
        except ValueError:
            raise ConfigError(f"--mix share for {name!r} is not a number: {value!r}") from None
        if not math.isfinite(v) or v < 0:
            raise ConfigError(f"--mix share for {name!r} must be >= 0, got {value!r}")
        shares[name.strip()] = v
    total = sum(shares.values())
    if total <= 0:
        raise ConfigError("--mix shares add up to 0; give at least one positive share")
    return {k: v / total for k, v in shares.items()}


def parse_ints(text: str, what: str, *, lo: int = 1) -> tuple[int, ...]:
    out = []
    for item in parse_csv(text, what):
        if not item.isdigit() or int(item) < lo:
            raise ConfigError(f"{what} takes integers >= {lo}, got {item!r}")
        out.append(int(item))
    return tuple(out)


@dataclass(frozen=True)
class BenchConfig:
    model: str
    workloads: tuple[str, ...]
    out: Path
    strategies: tuple[str, ...]
    known_strategies: tuple[str, ...]
    lookahead: LookaheadConfig = field(default_factory=LookaheadConfig)
    max_new_tokens: int = 256
    limit_per_class: int | None = None
    repeats: int = 1
    price_per_hour: float = DEFAULT_PRICE_PER_HOUR
    mix: dict[str, float] | None = None
    classes: tuple[str, ...] | None = None
    dtype: str = "float32"
    pack: bool = True  # linear weights packed once where that costs no exactness (models/packing.py)
    threads: int | None = None
    profile_contexts: tuple[int, ...] = (256, 1024)
    profile_file: Path | None = None
    warmup: bool = True
    progress: bool = True
    bootstrap: int = BOOTSTRAP_RESAMPLES

    def __post_init__(self) -> None:
        from lookahead.bench.variants import parse_strategies

        specs = parse_strategies(self.strategies, self.known_strategies)  # raises with the label and the fix
        cached = [label for label, spec in specs.items() if spec.ngram_cache]
        if cached and self.repeats > 1:
            raise ConfigError(f"{', '.join(cached)}: a cross-request cache learns each output, so a repeat would "
                              "find its own answer in it; run /cache strategies with --repeats 1")
        if len(set(self.strategies)) != len(self.strategies):
            raise ConfigError("--strategies names a strategy twice")
        if BASELINE not in self.strategies:
            raise ConfigError(f"--strategies must include {BASELINE}: every speedup and saving is measured against it")
        if len(self.strategies) < 2:
            raise ConfigError("--strategies needs at least one strategy besides autoregressive to compare")
        if self.max_new_tokens < 1:
            raise ConfigError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.limit_per_class is not None and self.limit_per_class < 1:
            raise ConfigError(f"--limit-per-class must be >= 1, got {self.limit_per_class}")
        if self.repeats < 1:
            raise ConfigError(f"--repeats must be >= 1, got {self.repeats}")
        if not (math.isfinite(self.price_per_hour) and self.price_per_hour >= 0):
            raise ConfigError(f"--price-per-hour must be a number >= 0, got {self.price_per_hour}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"--threads must be >= 1, got {self.threads}")
        if self.bootstrap < 100:
            raise ConfigError(f"bootstrap resamples must be >= 100, got {self.bootstrap}")

    def fingerprint(self) -> dict[str, Any]:
        """Settings a resumed run must share with the rows already in results.jsonl."""
        lk = self.lookahead
        return {
            "model": self.model,
            "dtype": self.dtype,
            "pack": self.pack,
            "max_new_tokens": self.max_new_tokens,
            "lookahead": {"window": lk.window, "ngram": lk.ngram, "guesses": lk.guesses},
            "threads": self.threads,
        }
