"""Frozen, validated configuration objects. Every value is checked here, at the edge."""

from __future__ import annotations

from dataclasses import dataclass, field

from lookahead.errors import ConfigError

# "lookahead": the hybrid pool (Jacobi, context and cross-request n-grams); "lookahead_jacobi": the
# paper's Jacobi-only pool; "prompt_lookup": context suffix matches; "speculative": a draft model.
STRATEGIES = ("lookahead", "autoregressive", "lookahead_jacobi", "prompt_lookup", "speculative")


def is_int(value: object) -> bool:
    """An integer, and not a bool (True is an int to Python, but not a window size or a port)."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class LookaheadConfig:
    """Shape of one lookahead step.

    window:  W, columns of the 2-D Jacobi window (parallel guesses of future positions).
    ngram:   N, n-gram length; the window keeps N-1 levels and verified candidates are N-1 tokens.
    guesses: G, how many pooled n-grams the verification branch checks per step.
    context_ngrams: also pool n-grams of the prompt and of the generated text (cheap, often the
        best candidates); set False for the pure Jacobi pool of the paper.
    context_tokens: longest context / cross-request candidate, in tokens after the root (None: N-1,
        like a Jacobi n-gram). Copied spans (quotes, code, JSON) can run far past N-1 tokens, and one
        longer candidate then settles more tokens per step, at the price of more query tokens.
    max_pool_per_key: n-grams kept per first token (oldest dropped first).
    sources: the free candidate sources the "lookahead" strategy draws from (names in
        candidates/registry.py); each offers up to G guesses a step, and the allocator
        (engine/allocator.py) verifies the calibrated best of them, at most `query_tokens` rows.
        The copy source is `suffix` (longest earlier match, continuations weighted by how often each
        followed, calibrated by match length), not prompt lookup's `context` (keys of 3, 2, 1 tokens):
        paired on held-out requests 0-4% faster on four of five classes (1% behind on math, and on
        prompts a-f) (docs/measurements.md, "Measured: the suffix source as the copy source"). `resume` guesses
        that a copy which broke off at one token goes on after it (docs/measurements.md, "Measured: a copy resumed
        after one changed token").
    hidden_states: let sources that compare the model's final hidden states have them: the engine then
        keeps every cached row's state off the decoder's last norm, and the suffix source flags the
        continuation of the occurrence whose state is nearest the current one, a calibration feature.
        Off by default: paired on two held-out slices it was neither faster nor slower (1.001x, 1.002x;
        docs/measurements.md, "Measured: the nearest occurrence by the model's own state").

    Defaults were measured on a 2-core CPU with SmolLM2-135M in bfloat16 and float32 (docs/measurements.md;
    README, "Performance"). Exact steps at reduced precision verify one chain (engine/query.py), so the rows
    are better spent on a long chain than on a wide Jacobi window (W=1). `context_tokens` bounds how
    deep a guess (copied or recycled) may go, not how deep a step verifies: the allocator
    (engine/allocator.py) takes a deeper prefix only where the calibrated odds of its tokens pay for
    the rows, so 11 costs nothing where guesses fail early (docs/measurements.md, "Measured: guesses up to 11 tokens
    deep").
    """

    window: int = 1
    ngram: int = 4
    guesses: int = 4
    context_ngrams: bool = True
    max_pool_per_key: int = 16
    context_tokens: int | None = 11
    sources: tuple[str, ...] = ("suffix", "recycle", "cache", "jacobi", "resume")
    hidden_states: bool = False

    def __post_init__(self) -> None:
        if not is_int(self.window) or self.window < 1:
            raise ConfigError(f"window (W) must be an integer >= 1, got {self.window!r}")
        if not is_int(self.ngram) or self.ngram < 2:
            raise ConfigError(f"ngram (N) must be an integer >= 2, got {self.ngram!r}")
        if not is_int(self.guesses) or self.guesses < 0:
            raise ConfigError(f"guesses (G) must be an integer >= 0, got {self.guesses!r}")
        if self.max_pool_per_key < 1:
            raise ConfigError(f"max_pool_per_key must be >= 1, got {self.max_pool_per_key!r}")
        if self.context_tokens is not None and (not is_int(self.context_tokens) or self.context_tokens < 1):
            raise ConfigError(f"context_tokens must be an integer >= 1 (or None for N-1), got {self.context_tokens!r}")
        if isinstance(self.sources, list):  # from a JSON/YAML policy file
            object.__setattr__(self, "sources", tuple(self.sources))
        if (not isinstance(self.sources, tuple) or not all(isinstance(n, str) and n for n in self.sources)
                or len(set(self.sources)) != len(self.sources)):
            raise ConfigError(f"sources must be a tuple of distinct source names, got {self.sources!r}")
        if not isinstance(self.hidden_states, bool):
            raise ConfigError(f"hidden_states must be True or False, got {self.hidden_states!r}")
        if self.query_tokens > 512:
            raise ConfigError(
                f"W={self.window}, N={self.ngram}, G={self.guesses}, context_tokens={self.context_tokens} puts "
                f"{self.query_tokens} tokens in one step; keep it under 512"
            )

    @property
    def candidate_tokens(self) -> int:
        """Longest verified candidate: max(N-1, context_tokens), or N-1 for the Jacobi-only pool."""
        return max(self.ngram - 1, self.context_tokens or 0) if self.context_ngrams else self.ngram - 1

    @property
    def query_tokens(self) -> int:
        """Upper bound on query tokens per step: 1 + W*(N-1) + G*candidate_tokens."""
        return 1 + self.window * (self.ngram - 1) + self.guesses * self.candidate_tokens


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
        if not is_int(self.top_k) or self.top_k < 0:
            raise ConfigError(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not is_int(self.seed) or not 0 <= self.seed < 2**63:
            raise ConfigError(f"seed must be an integer in [0, 2**63), got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


GREEDY = SamplingConfig()


@dataclass(frozen=True)
class PromptLookupConfig:
    """Prompt lookup: continuations of the longest suffix of the context (prompt + generated text)
    that occurred before.

    min_ngram, max_ngram: suffix lengths tried, longest first.
    num_tokens: tokens per candidate (how far a match is followed).
    max_candidates: matches verified at once (merged into one trie).
    """

    min_ngram: int = 1
    max_ngram: int = 3
    num_tokens: int = 8
    max_candidates: int = 4

    def __post_init__(self) -> None:
        for name in ("min_ngram", "max_ngram", "num_tokens", "max_candidates"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise ConfigError(f"prompt lookup {name} must be an integer >= 1, got {value!r}")
        if self.min_ngram > self.max_ngram:
            raise ConfigError(f"prompt lookup min_ngram ({self.min_ngram}) must be <= max_ngram ({self.max_ngram})")
        if self.max_ngram > 16:
            raise ConfigError(f"prompt lookup max_ngram must be <= 16, got {self.max_ngram}")
        if self.num_tokens * self.max_candidates + 1 > 512:
            raise ConfigError(f"num_tokens x max_candidates = {self.num_tokens * self.max_candidates} tokens in one "
                              "step; keep it under 512")


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding with a draft model.

    draft: "self:L" (the target's first L decoder layers plus its final norm and LM head: no second
        model in memory), "self" (half of the target's layers), or a model name or path for `load()`
        that shares the target's tokenizer. A LoadedModel passed as generate(..., draft=...) wins.
    draft_tokens: k, tokens the draft proposes per step.
    """

    draft: str = "self"
    draft_tokens: int = 4

    def __post_init__(self) -> None:
        if not is_int(self.draft_tokens) or not 1 <= self.draft_tokens <= 64:
            raise ConfigError(f"draft_tokens (k) must be an integer in [1, 64], got {self.draft_tokens!r}")
        if not isinstance(self.draft, str) or not self.draft.strip():
            raise ConfigError("draft must be 'self', 'self:L' (L >= 1 target layers) or a model name or path")
        if self.draft.startswith("self:"):
            tail = self.draft.split(":", 1)[1]
            if not tail.isdigit() or int(tail) < 1:
                raise ConfigError(f"self-draft {self.draft!r}: write self:L with L >= 1 layers of the target, e.g. self:8")

    @property
    def is_self_draft(self) -> bool:
        return self.draft == "self" or self.draft.startswith("self:")

    def self_draft_layers(self, target_layers: int) -> int:
        """L of a self-draft on a target with `target_layers` decoder layers ("self": half of them)."""
        if self.draft == "self":
            return max(1, target_layers // 2)
        return int(self.draft.split(":", 1)[1])


@dataclass(frozen=True)
class GenerationConfig:
    """Everything one generate() call needs besides the model and the prompt."""

    max_new_tokens: int = 256
    strategy: str = "lookahead"
    lookahead: LookaheadConfig = field(default_factory=LookaheadConfig)
    sampling: SamplingConfig = GREEDY
    prompt_lookup: PromptLookupConfig = field(default_factory=PromptLookupConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    stop: tuple[str, ...] = ()
    # Size every step by expected tokens per unit of the device's measured cost (engine/allocator.py).
    # Never changes the tokens; False verifies every draft as proposed.
    adaptive: bool = True
    # Pad every pass to the model's width floor (engine/numerics.py) so that tokens are bit-identical
    # to padded autoregressive decoding at reduced precision; False runs unpadded.
    exact: bool = True

    def __post_init__(self) -> None:
        if not is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"unknown strategy {self.strategy!r}; choose one of {', '.join(STRATEGIES)}")
        if any((not isinstance(s, str)) or s == "" for s in self.stop):
            raise ConfigError("stop strings must be non-empty strings")

    @property
    def widest_step(self) -> int:
        """Upper bound on the query rows of one decoding step under this configuration."""
        if self.strategy in ("lookahead", "lookahead_jacobi"):
            return self.lookahead.query_tokens
        if self.strategy == "prompt_lookup":
            return 1 + self.prompt_lookup.num_tokens * self.prompt_lookup.max_candidates
        if self.strategy == "speculative":
            return 1 + self.speculative.draft_tokens
        return 1
