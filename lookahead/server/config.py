"""ServerConfig: every knob of `lookahead serve`, validated once, at the edge."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from lookahead.config import is_int
from lookahead.errors import ConfigError
from lookahead.policy import DEFAULT_POLICY, Policy

CLIENT_OVERRIDES = ("off", "capped", "on")
ALL_CLASSES = "*"  # in an API key's cache classes: every opted-in class
CLASS_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")  # a request class name


def builtin_policy_text(policy: Policy = DEFAULT_POLICY) -> str:
    """What /v1/policy and the start line call the built-in policy, from the decision in force."""
    return f"built-in default ({policy.default.describe()}, for every request)"


@dataclass(frozen=True)
class ServerConfig:
    """How the server runs. Build it from CLI flags (see lookahead/server/cli.py) or directly in code.

    max_queue: requests that may wait while one runs; one more gets 429 with Retry-After at once.
    request_timeout_s: bound on queue wait + generation for one request.
    price_per_hour_usd: price of one device-hour; turns device-seconds into `cost_usd`.
    default_max_tokens: completion budget when a request gives no max_tokens (capped by the context).
    shutdown_timeout_s: on SIGTERM, how long in-flight requests may run before they are cancelled.
    max_class_labels: distinct request classes (beyond the policy's) given their own metrics label;
        later ones are counted as "other", so a client cannot grow the metrics without bound.
    ngram_cache_classes: request classes (as labelled in metrics; "default" = unlabelled traffic) that
        keep a cross-request n-gram cache: n-grams of their finished responses are offered as candidates
        to later requests of the same class (lookahead and prompt_lookup). Opt-in; bounded, LRU.
    ngram_cache_file: where those caches are loaded from at start (if the file exists) and saved to at
        shutdown. Set by the operator only; no request field can name a file.
    learned_file: where what each request class learned (its calibrated acceptance, the model's recycled
        successors; lookahead/learned.py) is loaded from at start (if the file exists) and saved to at
        shutdown, so a restarted server verifies as much as the old one had learned to. Operator only.
    policy_source: where the policy came from, as /v1/policy shows it (a file name, never a path);
        empty: derived from the policy (the built-in default's shape, or "set in code").
    api_keys: (key, cache classes) pairs besides `api_key`: each key may use the n-gram caches of the
        classes listed ("*" = all); a request whose key is not bound to its class runs without the cache.
        `api_key` is bound to every class.
    client_overrides: what a request's own `lookahead` field may do: "off" (refused), "capped" (at most
        as many query tokens per step as the policy's own decision for that request), "on" (up to 512).
    adaptive: let the engine's speculation gate skip speculation where it does not pay on this device
        (False: every step runs the decision's full draft; the tokens are the same either way).
    max_connections: uvicorn's limit_concurrency: connections beyond it get 503 at once.
    max_batch: requests decoded together in one forward pass (continuous batching; 1: one at a time).
    max_rows: most query rows one pass may carry across its requests (None: what the device's cost
        curve says pays); every request in the batch always gets its root row.
    max_kv_tokens: most KV-cache tokens (prompt + max_tokens) the requests in flight and queued may
        reserve; one beyond it gets 429 with Retry-After. None: max_batch x the model's context.
    prefix_cache_mb: memory for prompt prefixes' keys and values kept across requests (engine/prefix_cache.py):
        a prompt that starts like an earlier one prefills only the rest, with the same tokens out; 0 turns
        it off (e.g. where tenants must not learn from response times that another sent the same prefix).
    """

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    policy: Policy = field(default=DEFAULT_POLICY)
    policy_source: str = ""
    max_queue: int = 16
    request_timeout_s: float = 300.0
    price_per_hour_usd: float = 0.0
    max_body_bytes: int = 2 * 1024 * 1024
    default_max_tokens: int = 256
    shutdown_timeout_s: float = 10.0
    max_class_labels: int = 32
    ngram_cache_classes: tuple[str, ...] = ()
    ngram_cache_file: str | None = None
    learned_file: str | None = None
    api_keys: tuple[tuple[str, tuple[str, ...]], ...] = ()
    client_overrides: str = "capped"
    adaptive: bool = True
    max_connections: int = 128
    max_batch: int = 8
    max_rows: int | None = None
    max_kv_tokens: int | None = None
    prefix_cache_mb: int = 256

    def __post_init__(self) -> None:
        if not self.policy_source:
            source = builtin_policy_text(self.policy) if self.policy == DEFAULT_POLICY else "set in code"
            object.__setattr__(self, "policy_source", source)
        if not isinstance(self.host, str) or not self.host:
            raise ConfigError("host must be a non-empty address such as 127.0.0.1")
        if not is_int(self.port) or not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be an integer in 0..65535, got {self.port!r}")
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key.strip()):
            raise ConfigError("the API key is empty; give a non-empty --api-key or leave it out to disable auth")
        if not isinstance(self.policy, Policy):
            raise ConfigError("policy must be a lookahead.policy.Policy (see load_policy)")
        if not is_int(self.max_queue) or self.max_queue < 1:
            raise ConfigError(f"max queue must be an integer >= 1, got {self.max_queue!r}")
        for name in ("request_timeout_s", "shutdown_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ConfigError(f"{name.removesuffix('_s').replace('_', ' ')} must be > 0 seconds, got {value!r}")
        price = self.price_per_hour_usd
        if not isinstance(price, (int, float)) or isinstance(price, bool) or not 0 <= price < float("inf"):
            raise ConfigError(f"price per hour must be a finite number of USD >= 0, got {price!r}")
        limits = (("max_body_bytes", 1024), ("default_max_tokens", 1), ("max_class_labels", 0), ("max_connections", 1),
                  ("max_batch", 1), ("prefix_cache_mb", 0))
        for name, low in limits:
            value = getattr(self, name)
            if not is_int(value) or value < low:
                raise ConfigError(f"{name.replace('_', ' ')} must be an integer >= {low}, got {value!r}")

        classes = self.ngram_cache_classes
        if not isinstance(classes, tuple) or not all(isinstance(c, str) and c.strip() for c in classes):
            raise ConfigError(f"n-gram cache classes must be non-empty class names, got {classes!r}")
        if self.ngram_cache_file is not None and not (isinstance(self.ngram_cache_file, str) and self.ngram_cache_file):
            raise ConfigError("the n-gram cache file is empty; give a path or leave --ngram-cache-file out")
        if self.learned_file is not None and not (isinstance(self.learned_file, str) and self.learned_file):
            raise ConfigError("the learned-state file is empty; give a path or leave --learned-file out")
        if self.client_overrides not in CLIENT_OVERRIDES:
            raise ConfigError(f"client overrides must be one of {', '.join(CLIENT_OVERRIDES)}, got {self.client_overrides!r}")
        if not isinstance(self.adaptive, bool):
            raise ConfigError(f"adaptive must be true or false, got {self.adaptive!r}")
        for name, low in (("max_rows", self.max_batch), ("max_kv_tokens", 1)):
            value = getattr(self, name)
            if value is not None and (not is_int(value) or value < low):
                raise ConfigError(f"{name.replace('_', ' ')} must be an integer >= {low}, got {value!r}")
        self._check_api_keys()

    def _check_api_keys(self) -> None:
        seen = {self.api_key}
        for i, entry in enumerate(self.api_keys):  # messages never echo a key
            if not (isinstance(entry, tuple) and len(entry) == 2):
                raise ConfigError(f"api_keys[{i}] must be a (key, cache classes) pair")
            key, classes = entry
            if not isinstance(key, str) or not key.strip() or key != key.strip():
                raise ConfigError(f"API key #{i + 1} is empty or has surrounding spaces")
            if key in seen:
                raise ConfigError(f"API key #{i + 1} is given twice; give each key once, with all its classes")
            seen.add(key)
            bad = [c for c in classes if c != ALL_CLASSES and not (isinstance(c, str) and CLASS_RE.fullmatch(c))]
            if not isinstance(classes, tuple) or bad:
                raise ConfigError(f"API key #{i + 1}: cache classes must be class names or '*', got {bad or classes!r}")

    @property
    def auth_enabled(self) -> bool:
        return self.api_key is not None or bool(self.api_keys)

    def key_classes(self) -> dict[str, frozenset[str]]:
        """Every accepted API key -> the n-gram cache classes it may use ("*" = all)."""
        keys = {key: frozenset(classes) for key, classes in self.api_keys}
        if self.api_key is not None:
            keys[self.api_key] = frozenset({ALL_CLASSES})
        return keys

