"""Frozen, validated configuration objects. Every value is checked here, at the edge."""

from __future__ import annotations

from dataclasses import dataclass, field

from lookahead.errors import ConfigError

STRATEGIES = ("lookahead", "autoregressive")


@dataclass(frozen=True)
class LookaheadConfig:
    """Shape of one lookahead step.

    window:  W, columns of the 2-D Jacobi window (parallel guesses of future positions).
    ngram:   N, n-gram length; the window keeps N-1 levels and verified candidates are N-1 tokens.
    guesses: G, how many pooled n-grams the verification branch checks per step.
    context_ngrams: also pool n-grams of the prompt and of the generated text (cheap, often the
        best candidates); set False for the pure Jacobi pool of the paper.
    max_pool_per_key: n-grams kept per first token (oldest dropped first).

    Defaults were measured on a 2-core CPU with SmolLM2-135M (see README, "Choosing W, N, G").
    """

    window: int = 4
    ngram: int = 4
    guesses: int = 4
    context_ngrams: bool = True
    max_pool_per_key: int = 16

    def __post_init__(self) -> None:
        if not isinstance(self.window, int) or self.window < 1:
            raise ConfigError(f"window (W) must be an integer >= 1, got {self.window!r}")
        if not isinstance(self.ngram, int) or self.ngram < 2:
            raise ConfigError(f"ngram (N) must be an integer >= 2, got {self.ngram!r}")
        if not isinstance(self.guesses, int) or self.guesses < 0:
            raise ConfigError(f"guesses (G) must be an integer >= 0, got {self.guesses!r}")
        if self.max_pool_per_key < 1:
            raise ConfigError(f"max_pool_per_key must be >= 1, got {self.max_pool_per_key!r}")
        if self.window * (self.ngram - 1) + self.guesses * (self.ngram - 1) + 1 > 512:
            raise ConfigError(
                f"W={self.window}, N={self.ngram}, G={self.guesses} puts "
                f"{self.query_tokens} tokens in one step; keep it under 512"
            )

    @property
    def query_tokens(self) -> int:
        """Upper bound on query tokens per step: 1 + W*(N-1) + G*(N-1)."""
        return 1 + (self.window + self.guesses) * (self.ngram - 1)


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is chosen. temperature == 0 means greedy.

    With temperature > 0 the token at absolute position t is argmax(processed_logits + gumbel(seed, t)):
    a deterministic function of the distribution, the seed and t, so lookahead and autoregressive
    decoding pick identical tokens, and each pick is an exact sample of softmax(processed_logits).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0):
            raise ConfigError(f"temperature must be >= 0, got {self.temperature!r}")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0 (0 disables it), got {self.top_k!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not (0 <= self.seed < 2**63):
            raise ConfigError(f"seed must be in [0, 2**63), got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


GREEDY = SamplingConfig()


@dataclass(frozen=True)
class GenerationConfig:
    """Everything one generate() call needs besides the model and the prompt."""

    max_new_tokens: int = 256
    strategy: str = "lookahead"
    lookahead: LookaheadConfig = field(default_factory=LookaheadConfig)
    sampling: SamplingConfig = GREEDY
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"unknown strategy {self.strategy!r}; choose one of {', '.join(STRATEGIES)}")
        if any((not isinstance(s, str)) or s == "" for s in self.stop):
            raise ConfigError("stop strings must be non-empty strings")
