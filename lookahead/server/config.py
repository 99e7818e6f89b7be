"""ServerConfig: every knob of `lookahead serve`, validated once, at the edge."""

from __future__ import annotations

from dataclasses import dataclass, field

from lookahead.errors import ConfigError
from lookahead.server.policy import DEFAULT_POLICY, Policy


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
    """

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    policy: Policy = field(default=DEFAULT_POLICY)
    policy_source: str = "built-in default (lookahead, W=4 N=4 G=4, for every request)"
    max_queue: int = 16
    request_timeout_s: float = 300.0
    price_per_hour_usd: float = 0.0
    max_body_bytes: int = 2 * 1024 * 1024
    default_max_tokens: int = 256
    shutdown_timeout_s: float = 10.0
    max_class_labels: int = 32
    ngram_cache_classes: tuple[str, ...] = ()
    ngram_cache_file: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise ConfigError("host must be a non-empty address such as 127.0.0.1")
        if not _is_int(self.port) or not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be an integer in 0..65535, got {self.port!r}")
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key.strip()):
            raise ConfigError("the API key is empty; give a non-empty --api-key or leave it out to disable auth")
        if not isinstance(self.policy, Policy):
            raise ConfigError("policy must be a lookahead.server.policy.Policy (see load_policy)")
        if not _is_int(self.max_queue) or self.max_queue < 1:
            raise ConfigError(f"max queue must be an integer >= 1, got {self.max_queue!r}")
        for name in ("request_timeout_s", "shutdown_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ConfigError(f"{name.removesuffix('_s').replace('_', ' ')} must be > 0 seconds, got {value!r}")
        price = self.price_per_hour_usd
        if not isinstance(price, (int, float)) or isinstance(price, bool) or not 0 <= price < float("inf"):
            raise ConfigError(f"price per hour must be a finite number of USD >= 0, got {price!r}")
        for name, low in (("max_body_bytes", 1024), ("default_max_tokens", 1), ("max_class_labels", 0)):
            value = getattr(self, name)
            if not _is_int(value) or value < low:
                raise ConfigError(f"{name.replace('_', ' ')} must be an integer >= {low}, got {value!r}")

        classes = self.ngram_cache_classes
        if not isinstance(classes, tuple) or not all(isinstance(c, str) and c.strip() for c in classes):
            raise ConfigError(f"n-gram cache classes must be non-empty class names, got {classes!r}")
        if self.ngram_cache_file is not None and not (isinstance(self.ngram_cache_file, str) and self.ngram_cache_file):
            raise ConfigError("the n-gram cache file is empty; give a path or leave --ngram-cache-file out")

    @property
    def auth_enabled(self) -> bool:
        return self.api_key is not None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
