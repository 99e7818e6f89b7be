"""Build the Ray Serve application (ingress + engine deployments) and run it until SIGTERM/SIGINT.

    HTTP -> Ray Serve proxy -> Ingress (cluster/ingress.py) -> Engine replicas (cluster/replica.py)
                                        \\-> Engine-<class> replicas, for classes with their own

Ray is imported here and only here (and in the modules this one loads): the library and the
single-process server never need it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from dataclasses import replace
from typing import Any

from lookahead.cluster.config import ENGINE, ClusterConfig
from lookahead.cluster.ingress import IngressApp
from lookahead.cluster.metrics import cluster_metrics_text, node_metrics_urls
from lookahead.cluster.replica import EngineReplica, ReplicaSpec
from lookahead.errors import ConfigError
from lookahead.server.middleware import AuthMiddleware

log = logging.getLogger("lookahead.cluster")
INGRESS = "Ingress"
RAY_EXTRA = "pip install 'lookahead-decoding[ray]'  (or: pip install 'ray[serve]==2.60.0')"


def require_ray() -> None:
    """Ray is optional: say how to get it instead of an ImportError deep in a stack trace."""
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
    except ImportError:
        raise ConfigError(f"--ray needs Ray Serve, which is not installed: {RAY_EXTRA}") from None


class Ingress:
    """The ingress deployment's body: builds the ASGI app in its replica (Ray calls the method below)."""

    def __init__(self, handles: dict[str, Any], routes: dict[str, str], app_name: str, max_body_bytes: int,
                 keys: dict[str, frozenset[str]]) -> None:
        self._handles = handles
        self._routes = routes
        self._app_name = app_name
        self._max_body = max_body_bytes
        self._keys = keys

    def __serve_build_asgi_app__(self) -> Any:
        app: Any = IngressApp(self._handles, self._routes, ENGINE, health=self.replica_states,
                              metrics=self.metrics_text, max_body_bytes=self._max_body)
        return AuthMiddleware(app, keys=self._keys) if self._keys else app

    def replica_states(self) -> dict[str, dict[str, int]]:
        """Engine deployment -> {replica state: count}, from the Ray Serve controller."""
        from ray import serve

        deployments = serve.status().applications[self._app_name].deployments
        return {name: dict(d.replica_states) for name, d in deployments.items() if name != INGRESS}

    @staticmethod
    def metrics_text() -> str:
        import ray

        return cluster_metrics_text(node_metrics_urls(ray.nodes()))


def build_app(spec: ReplicaSpec, cluster: ClusterConfig, *, cpus: int | None = None) -> Any:
    """The Ray Serve application: one engine deployment (plus one per class in cluster.class_replicas)
    and the ingress in front. `cpus`: the cores of this machine (for torch threads per replica)."""
    from ray import serve

    # One core stays with Ray's proxy and the ingress (spinning model threads that share it slow both:
    # `lookahead serve --threads`).
    threads = cluster.threads or spec.threads or max(1, ((cpus or os.cpu_count() or 1) - 1) // cluster.total_replicas)
    spec = replace(spec, threads=threads)
    config = spec.config
    options: dict[str, Any] = {
        "ray_actor_options": {"num_cpus": threads},
        "max_ongoing_requests": cluster.max_ongoing or config.max_batch + config.max_queue,
        "graceful_shutdown_timeout_s": config.shutdown_timeout_s + 5,
        "graceful_shutdown_wait_loop_s": 0.5,
        "health_check_period_s": cluster.health_check_period_s,
        "health_check_timeout_s": max(30.0, 5 * cluster.health_check_period_s),
    }
    engine = serve.deployment(EngineReplica)
    handles: dict[str, Any] = {}
    if cluster.autoscaling:
        handles[ENGINE] = engine.options(name=ENGINE, autoscaling_config={
            "min_replicas": cluster.min_replicas, "max_replicas": cluster.max_replicas,
            "initial_replicas": cluster.replicas,
            "target_ongoing_requests": cluster.target_ongoing or config.max_batch,
            "upscale_delay_s": 5.0, "downscale_delay_s": 60.0,
        }, **options).bind(spec)
    else:
        handles[ENGINE] = engine.options(name=ENGINE, num_replicas=cluster.replicas, **options).bind(spec)
    for entry in cluster.class_replicas:
        handles[entry.deployment] = engine.options(name=entry.deployment, num_replicas=entry.replicas,
                                                   **options).bind(spec)
    ingress = serve.deployment(serve.ingress()(Ingress), name=INGRESS, ray_actor_options={"num_cpus": 0},
                               max_ongoing_requests=10_000)
    return ingress.bind(handles, cluster.routes(), cluster.app_name, config.max_body_bytes, config.key_classes())


def start_ray(cluster: ClusterConfig) -> bool:
    """Join the cluster at cluster.address, or start a local Ray instance. Returns True when started here."""
    import ray

    if cluster.address is not None:
        ray.init(address=cluster.address, logging_level=logging.WARNING)
        return False
    ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False, logging_level=logging.WARNING,
             _metrics_export_port=cluster.metrics_export_port,
             _system_config={"metrics_report_interval_ms": 2000})
    return True


def deploy(spec: ReplicaSpec, cluster: ClusterConfig, *, host: str, port: int, log_level: str = "INFO") -> None:
    """Start Ray Serve's proxy on host:port and deploy the application; returns once replicas run."""
    import ray
    from ray import serve

    cpus = int(ray.cluster_resources().get("CPU", os.cpu_count() or 1)) if cluster.address else None
    serve.start(http_options={"host": host, "port": port})
    serve.run(build_app(spec, cluster, cpus=cpus), name=cluster.app_name, route_prefix="/",
              logging_config={"log_level": log_level.upper()})


def serve_forever(spec: ReplicaSpec, cluster: ClusterConfig, *, host: str, port: int, log_level: str = "info") -> None:
    """`lookahead serve --ray`: deploy, serve until SIGTERM/SIGINT, then drain (each replica finishes its
    requests, bounded by --shutdown-timeout) and leave (a local Ray instance stops with us)."""
    import ray
    from ray import serve

    require_ray()
    started_here = start_ray(cluster)
    try:
        try:
            deploy(spec, cluster, host=host, port=port, log_level=log_level)
        except Exception as exc:  # a replica that cannot load the model, a busy port, ...
            raise ConfigError(f"the Ray Serve application did not start: {exc}") from None
        where = cluster.address or "a local Ray instance"
        print(f"lookahead: serving {spec.model or 'the default model'} on http://{host}:{port} with "
              f"{cluster.total_replicas} replica(s) on {where} (policy: {spec.config.policy_source})", flush=True)
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        stop.wait()
        print("lookahead: draining the replicas", flush=True)
        serve.delete(cluster.app_name)  # waits for each replica's graceful shutdown
    finally:
        if started_here:
            serve.shutdown()
        ray.shutdown()
