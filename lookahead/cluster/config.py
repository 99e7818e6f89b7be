"""ClusterConfig: how `lookahead serve --ray` lays the server out over Ray Serve replicas.

Plain data, validated once at the edge (the CLI, or code that builds it), importable without Ray.
"""

from __future__ import annotations

from dataclasses import dataclass

from lookahead.errors import ConfigError
from lookahead.server.config import CLASS_RE

DEFAULT_APP = "lookahead"
ENGINE = "Engine"  # the deployment that serves every class without replicas of its own


@dataclass(frozen=True)
class ClassReplicas:
    """A request class served by replicas of its own (e.g. a class the policy pins to autoregressive)."""

    request_class: str
    replicas: int

    @property
    def deployment(self) -> str:
        return f"{ENGINE}-{self.request_class}"


@dataclass(frozen=True)
class ClusterConfig:
    """The replica layout.

    replicas: engine replicas (each loads the model and runs the batched scheduler); with
        autoscaling, the number it starts with.
    min_replicas / max_replicas: set both to autoscale the engine replicas on their queue length
        (Ray Serve's autoscaler, aiming at `target_ongoing` requests in flight per replica).
    target_ongoing: requests in flight per replica the autoscaler aims at (default: the replica's
        max batch: a replica is "full" when its batch is).
    max_ongoing: most requests Ray hands one replica at once (the rest wait in Ray's queue);
        None: max batch + max queue, what the replica itself would accept.
    threads: torch threads per replica (None: the machine's cores less one, divided among the
        replicas that start on it, at least 1).
    class_replicas: request classes with deployments of their own; the router sends a request there
        by its class (header X-Request-Class, else metadata.request_class).
    address: an existing Ray cluster to join (ray://host:10001 or host:6379); None starts a local one.
    app_name: the Ray Serve application's name.
    health_check_period_s: how often Ray checks each replica (a dead one is replaced after that).
    metrics_export_port: where a local Ray instance exports Prometheus metrics (None: Ray's choice).
    """

    replicas: int = 2
    min_replicas: int | None = None
    max_replicas: int | None = None
    target_ongoing: int | None = None
    max_ongoing: int | None = None
    threads: int | None = None
    class_replicas: tuple[ClassReplicas, ...] = ()
    address: str | None = None
    app_name: str = DEFAULT_APP
    health_check_period_s: float = 2.0
    metrics_export_port: int | None = None

    def __post_init__(self) -> None:
        for name in ("replicas", "min_replicas", "max_replicas", "target_ongoing", "max_ongoing", "threads"):
            value = getattr(self, name)
            low = 0 if name == "min_replicas" else 1
            if value is not None and (not _is_int(value) or value < low):
                raise ConfigError(f"{name.replace('_', ' ')} must be an integer >= {low}, got {value!r}")
        if (self.min_replicas is None) != (self.max_replicas is None):
            raise ConfigError("give both --min-replicas and --max-replicas to autoscale, or neither")
        if self.autoscaling and not self.min_replicas <= self.replicas <= self.max_replicas:  # type: ignore[operator]
            raise ConfigError(
                f"--replicas {self.replicas} must lie within --min-replicas {self.min_replicas} and "
                f"--max-replicas {self.max_replicas} (it is how many start)")
        seen: set[str] = set()
        for entry in self.class_replicas:
            if not CLASS_RE.fullmatch(entry.request_class):
                raise ConfigError(f"{entry.request_class[:80]!r} is not a class name (letters, digits, _ . : -)")
            if not _is_int(entry.replicas) or entry.replicas < 1:
                raise ConfigError(f"class {entry.request_class}: replicas must be an integer >= 1, got {entry.replicas!r}")
            if entry.request_class in seen:
                raise ConfigError(f"class {entry.request_class} is given twice in --class-replicas")
            seen.add(entry.request_class)
        if self.address is not None and (not isinstance(self.address, str) or not self.address.strip()):
            raise ConfigError("the Ray address is empty; give ray://HOST:10001 or HOST:6379, or leave it out")
        if not isinstance(self.app_name, str) or not CLASS_RE.fullmatch(self.app_name):
            raise ConfigError(f"the application name must be a short name (letters, digits, _ . : -), got {self.app_name!r}")
        period = self.health_check_period_s
        if not isinstance(period, (int, float)) or isinstance(period, bool) or not 0 < period < 3600:
            raise ConfigError(f"health check period must be > 0 seconds, got {period!r}")
        port = self.metrics_export_port
        if port is not None and (not _is_int(port) or not 1 <= port <= 65535):
            raise ConfigError(f"metrics export port must be an integer in 1..65535, got {port!r}")

    @property
    def autoscaling(self) -> bool:
        return self.min_replicas is not None

    @property
    def total_replicas(self) -> int:
        """Engine replicas at start, the per-class deployments' included."""
        return self.replicas + sum(c.replicas for c in self.class_replicas)

    def routes(self) -> dict[str, str]:
        """Request class -> the deployment that serves it (classes not listed go to ENGINE)."""
        return {c.request_class: c.deployment for c in self.class_replicas}


def parse_class_replicas(text: str) -> tuple[ClassReplicas, ...]:
    """'code=2,chat=1' -> (ClassReplicas('code', 2), ClassReplicas('chat', 1)); errors name the entry."""
    entries: list[ClassReplicas] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, count = part.partition("=")
        if not sep or not count.strip().isdigit():
            raise ConfigError(f"--class-replicas entry {part[:80]!r}: write CLASS=N, e.g. chat=1")
        entries.append(ClassReplicas(name.strip(), int(count)))
    return tuple(entries)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
