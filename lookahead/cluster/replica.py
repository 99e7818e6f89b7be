"""EngineReplica: one Ray Serve replica = one loaded model + the single-process server app around it.

The replica runs exactly what `lookahead serve` runs (create_app: auth, the per-class policy, the
batched scheduler, metrics), without a socket: the ingress (cluster/ingress.py) hands it each HTTP
request over a Ray Serve handle and relays the ASGI messages back (cluster/bridge.py). So a replica
answers every request, errors included, as the single-process server would.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from lookahead.cluster.bridge import ACCEPTED, REPLICA_HEADER, run_asgi
from lookahead.server.config import ServerConfig

log = logging.getLogger("lookahead.cluster")


@dataclass(frozen=True)
class ReplicaSpec:
    """What every engine replica loads: the model (name or path, as `lookahead serve --model`), its
    dtype, the server settings, whether its linear weights are packed (`--no-pack`: False), torch threads (None: leave torch's default), and `setup`: a function
    run in the replica's process before the model loads (environment, logging; tests slow steps)."""

    model: str | None
    dtype: str
    config: ServerConfig
    threads: int | None = None
    setup: Callable[[], None] | None = None
    metrics_interval_s: float = 2.0
    pack: bool = True


class EngineReplica:
    """The body of the engine deployment (cluster/launch.py wraps it with serve.deployment)."""

    def __init__(self, spec: ReplicaSpec) -> None:
        import torch
        from ray import serve

        from lookahead.cluster.metrics import RayMetricsExporter
        from lookahead.server.app import create_app
        from lookahead.server.startup import load_model, load_policy_drafts

        if spec.setup is not None:
            spec.setup()
        if spec.threads is not None:
            torch.set_num_threads(spec.threads)
        loaded = load_model(spec.model, spec.dtype, spec.pack)
        self.app = create_app(loaded, spec.config, drafts=load_policy_drafts(spec.config.policy, loaded))
        self.replica = serve.get_replica_context().replica_id.unique_id
        self._headers = [(REPLICA_HEADER.encode(), self.replica.encode())]
        self.app.state.startup()
        self._exporter = RayMetricsExporter(self.app.state.metrics.registry, self.replica,
                                            interval_s=spec.metrics_interval_s)
        self._exporter.start()
        self._stopped = False
        log.info("replica %s: serving %s (pid %d, %d torch threads)", self.replica, loaded.name, os.getpid(),
                 torch.get_num_threads())

    async def asgi(self, scope: dict[str, Any], body: bytes) -> AsyncIterator[dict[str, Any]]:
        """One HTTP request through the server app; yields ACCEPTED first, then the ASGI messages."""
        yield {"type": ACCEPTED, "replica": self.replica}
        async for message in run_asgi(self.app, scope, body, headers=self._headers):
            yield message

    def identity(self) -> dict[str, Any]:
        """Who this replica is (tests and operators: which actor to look at, or to kill)."""
        import ray

        return {"replica": self.replica, "actor": ray.get_runtime_context().get_actor_name(), "pid": os.getpid()}

    def check_health(self) -> None:
        """Ray Serve's health check: a replica whose model worker thread died is replaced."""
        if not self.app.state.worker.alive:
            raise RuntimeError("the model worker thread stopped")

    def __del__(self) -> None:
        """Ray Serve calls this on a graceful stop, after in-flight requests drained (or its timeout)."""
        if getattr(self, "_stopped", True):
            return
        self._stopped = True
        self.app.state.shutdown()
        self._exporter.stop()
