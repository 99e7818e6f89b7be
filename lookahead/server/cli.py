"""`lookahead serve`: load a model and serve it over an OpenAI-compatible HTTP API."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import logging
import math
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from pathlib import Path

from lookahead.models.packing import NO_PACK_HELP
from lookahead.errors import LookaheadError
from lookahead.policy import load_policy
from lookahead.server.config import CLIENT_OVERRIDES, ServerConfig
from lookahead.server.startup import TINY_PREFIX, load_api_keys, load_model, load_policy_drafts

API_KEY_ENV = "LOOKAHEAD_API_KEY"
DEFAULT_MAX_BATCH = 8  # until the model is loaded and its batch costs are known (and under --ray)
__all__ = ["TINY_PREFIX", "add_arguments", "config_from_args", "load_model", "register", "serve_command"]


def register(subparsers: Any) -> None:
    """Add the `serve` subcommand to the CLI's subparsers."""
    p = subparsers.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve a model over an OpenAI-compatible HTTP API (chat, completions, streaming, "
        "per-class decoding policy, Prometheus metrics). See docs/server.md.",
    )
    add_arguments(p)
    p.set_defaults(func=serve_command)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", default=None, help="embedded model name, HF folder or .gguf file (default: the embedded SmolLM2)"
    )
    p.add_argument("--dtype", default="auto",
                   help="weights dtype: auto (default: the fastest this device runs well, measured once per model), "
                        "float32, bfloat16, float16, float64")
    p.add_argument("--no-pack", dest="pack", action="store_false",
                   help=NO_PACK_HELP)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, loopback only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV),
        help=f"require 'Authorization: Bearer KEY' on every endpoint but /health (default: ${API_KEY_ENV}; "
        "prefer the variable: a flag shows in the process list)",
    )
    p.add_argument(
        "--api-keys",
        metavar="FILE",
        help="several API keys, one a line: KEY [CLASS,CLASS...] binds the key to those n-gram cache classes",
    )
    p.add_argument("--policy", metavar="FILE", help="per-class decoding policy, JSON or YAML (see docs/server.md)")
    p.add_argument(
        "--client-overrides",
        choices=CLIENT_OVERRIDES,
        default="capped",
        help="what a request's own 'lookahead' field may do: off (refused), capped (default: at most the "
        "policy's own query tokens per step for that request), on (up to 512)",
    )
    p.add_argument(
        "--no-adaptive",
        dest="adaptive",
        action="store_false",
        help="run every step's full draft (the speculation gate stays off; the tokens are the same)",
    )
    p.add_argument(
        "--max-queue", type=int, default=16, metavar="N", help="requests that may wait for the model (default 16)"
    )
    p.add_argument(
        "--max-batch", type=int, default=None, metavar="N",
        help="requests decoded together in one forward pass (1: one at a time; default: where batching stops "
        "paying on this device, timed once per model and cached (lookahead profile re-times it); 8 under --ray)",
    )
    p.add_argument(
        "--max-rows", type=int, default=None, metavar="N",
        help="most query rows per pass across the batch (default: what the device's cost curve says pays)",
    )
    p.add_argument(
        "--max-kv-tokens", type=int, default=None, metavar="N",
        help="most KV-cache tokens (prompt + max_tokens) in flight and queued; beyond it 429 "
        "(default: max batch x the model's context)",
    )
    p.add_argument(
        "--prefix-cache-mb", type=int, default=256, metavar="MB",
        help="memory for prompt prefixes reused across requests (a prompt that starts like an earlier one "
        "prefills only the rest; same tokens out); 0: off (default: 256)",
    )
    p.add_argument(
        "--request-timeout",
        type=float,
        default=300.0,
        metavar="S",
        help="seconds per request, queue wait included (default 300)",
    )
    p.add_argument(
        "--price-per-hour",
        type=float,
        default=0.0,
        metavar="USD",
        help="device price per hour, for cost_usd (default 0)",
    )
    p.add_argument(
        "--default-max-tokens",
        type=int,
        default=256,
        metavar="N",
        help="completion budget when a request gives none (default 256)",
    )
    p.add_argument(
        "--max-body-bytes", type=int, default=2 * 1024 * 1024, metavar="B", help="request body limit (default 2 MiB)"
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=128,
        metavar="N",
        help="open connections beyond N get 503 at once (uvicorn's limit_concurrency; default 128)",
    )
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="on SIGTERM, seconds in-flight requests may finish (default 10)",
    )
    p.add_argument(
        "--ngram-cache",
        metavar="CLASS[,CLASS...]",
        default="",
        help="request classes that keep a cross-request n-gram cache ('default' = unlabelled traffic)",
    )
    p.add_argument(
        "--ngram-cache-file", metavar="FILE", help="load those caches from FILE at start (if it exists), save at exit"
    )
    p.add_argument("--learned-file", metavar="FILE", help="load what each request class learned (acceptance of its "
                   "guesses, the model's recycled successors) from FILE at start (if it exists), save at exit")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch threads for the model (default: the cores less one, at least 1: the HTTP side "
                   "needs a core, and spinning model threads that share it slow both; see docs/server.md)")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    ray = p.add_argument_group("scale out on Ray Serve (needs the [ray] extra; see docs/cluster.md)")
    ray.add_argument("--ray", action="store_true",
                     help="run the engine in Ray Serve replicas behind this endpoint (a local Ray instance "
                     "unless --ray-address)")
    ray.add_argument("--ray-address", metavar="ADDR", default=None,
                     help="join an existing Ray cluster (ray://HOST:10001 or HOST:6379) instead of starting one")
    ray.add_argument("--replicas", type=int, default=2, metavar="N",
                     help="engine replicas, each with its own copy of the model (default 2; with autoscaling: at start)")
    ray.add_argument("--min-replicas", type=int, default=None, metavar="N",
                     help="autoscale between --min-replicas and --max-replicas on requests in flight per replica")
    ray.add_argument("--max-replicas", type=int, default=None, metavar="N", help="see --min-replicas")
    ray.add_argument("--target-ongoing", type=int, default=None, metavar="N",
                     help="requests in flight per replica the autoscaler aims at (default: --max-batch)")
    ray.add_argument("--class-replicas", default="", metavar="CLASS=N[,...]",
                     help="request classes served by replicas of their own, e.g. chat=1 (routed by X-Request-Class "
                     "or metadata.request_class)")
    ray.add_argument("--threads-per-replica", type=int, default=None, metavar="N",
                     help="torch threads (and Ray CPUs) per replica (default: the cores less one, divided among the "
                     "replicas, at least 1)")


def serve_command(args: argparse.Namespace) -> int:
    """Handler of `lookahead serve`; returns the exit code (2 on bad input, with one error line)."""
    try:
        config = config_from_args(args)
        if config.ngram_cache_file:
            _check_cache_file(config.ngram_cache_file)
        if config.learned_file:
            from lookahead.learned import check_learned_file

            check_learned_file(config.learned_file)
        cluster = cluster_from_args(args)
        sock = _bind(config.host, config.port)
    except (LookaheadError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if cluster is not None:  # Ray Serve's proxy binds the port: the check above only failed fast
        sock.close()
        return _serve_ray(args, config, cluster)
    with sock:
        if not config.auth_enabled and not _is_loopback(config.host):
            print(
                f"warning: serving on {config.host} without --api-key: anyone who can reach it can use it",
                file=sys.stderr,
            )
        try:
            threads = model_threads(args.threads)
            import torch

            torch.set_num_threads(threads)
            loaded = load_model(args.model, args.dtype, args.pack)
            if args.max_batch is None:  # where batching stops paying on this device (scheduler/batch_costs.py)
                from lookahead.scheduler.batch_costs import default_max_batch

                config = replace(config, max_batch=default_max_batch(loaded)[0])
            drafts = load_policy_drafts(config.policy, loaded)
            from lookahead.learned import read_learned

            learned = read_learned(loaded, config.learned_file) if config.learned_file and \
                os.path.exists(config.learned_file) else {}
        except (LookaheadError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        run(loaded, config, sock, log_level=args.log_level, drafts=drafts, learned=learned)
    return 0


def model_threads(requested: int | None, cores: int | None = None) -> int:
    """Torch threads for `lookahead serve`: as asked, else every core but one (at least one).

    The server's event loop (HTTP, tokenizing, streaming) runs beside the model worker; OpenMP threads
    spin while they wait, so model threads on every core starve the loop and the loop stalls the
    threads. Measured on 2 cores, SmolLM2 bf16, 8 streaming clients: 96 tokens/s with 1 thread, 49
    with 2 (docs/results/cluster-load)."""
    if requested is not None:
        if isinstance(requested, bool) or requested < 1:
            raise LookaheadError(f"--threads must be an integer >= 1, got {requested}")
        return requested
    return max(1, (cores or os.cpu_count() or 1) - 1)


def cluster_from_args(args: argparse.Namespace) -> Any:
    """The ClusterConfig of `serve --ray` (None without --ray; Ray flags without --ray are an error)."""
    from lookahead.cluster.config import ClusterConfig, parse_class_replicas

    given = [flag for flag, value in (("--ray-address", args.ray_address), ("--min-replicas", args.min_replicas),
                                      ("--max-replicas", args.max_replicas), ("--class-replicas", args.class_replicas),
                                      ("--target-ongoing", args.target_ongoing),
                                      ("--threads-per-replica", args.threads_per_replica)) if value]
    if not args.ray:
        if given:
            raise LookaheadError(f"{given[0]} only applies with --ray")
        return None
    if args.threads is not None:
        raise LookaheadError("--threads is for one process; under --ray give --threads-per-replica")
    if args.ngram_cache_file:
        raise LookaheadError("--ngram-cache-file is per process; under --ray each replica keeps its own caches "
                             "in memory (use --ngram-cache without a file)")
    if args.learned_file:
        raise LookaheadError("--learned-file is per process; under --ray each replica learns in memory")
    from lookahead.cluster.launch import require_ray

    require_ray()
    return ClusterConfig(replicas=args.replicas, min_replicas=args.min_replicas, max_replicas=args.max_replicas,
                         target_ongoing=args.target_ongoing, class_replicas=parse_class_replicas(args.class_replicas),
                         threads=args.threads_per_replica, address=args.ray_address)


def _serve_ray(args: argparse.Namespace, config: ServerConfig, cluster: Any) -> int:
    from lookahead.cluster.launch import serve_forever
    from lookahead.cluster.replica import ReplicaSpec

    logging.getLogger("lookahead.cluster").setLevel(args.log_level.upper())
    try:
        serve_forever(ReplicaSpec(model=args.model, dtype=args.dtype, config=config, pack=args.pack), cluster,
                      host=config.host, port=config.port, log_level=args.log_level)
    except LookaheadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _check_cache_file(path: str) -> None:
    """Refuse, before the model loads, a cache file that cannot be read or will not be writable at exit."""
    from lookahead.candidates.ngram_cache import NGramCaches

    if os.path.exists(path):
        NGramCaches.load(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise LookaheadError(f"cannot write the n-gram cache file {path}: {folder} is not a writable folder")


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    policy_args: dict[str, Any] = {}
    if args.policy:  # clients see the file's name, never the server's path to it
        policy_args = {"policy": load_policy(args.policy), "policy_source": Path(args.policy).name}
    return ServerConfig(
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        api_keys=load_api_keys(args.api_keys) if args.api_keys else (),
        client_overrides=args.client_overrides,
        adaptive=args.adaptive,
        max_connections=args.max_connections,
        **policy_args,
        max_queue=args.max_queue,
        max_batch=DEFAULT_MAX_BATCH if args.max_batch is None else args.max_batch,
        max_rows=args.max_rows,
        max_kv_tokens=args.max_kv_tokens,
        prefix_cache_mb=args.prefix_cache_mb,
        request_timeout_s=args.request_timeout,
        price_per_hour_usd=args.price_per_hour,
        max_body_bytes=args.max_body_bytes,
        default_max_tokens=args.default_max_tokens,
        shutdown_timeout_s=args.shutdown_timeout,
        ngram_cache_classes=tuple(c.strip() for c in args.ngram_cache.split(",") if c.strip()),
        ngram_cache_file=args.ngram_cache_file,
        learned_file=args.learned_file,
    )


def _bind(host: str, port: int) -> socket.socket:
    """Bind before loading the model, so a busy port fails in a second, not after the load."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise OSError(f"cannot resolve --host {host!r}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise OSError(
            f"cannot listen on {host}:{port}: {exc.strerror}; choose another --port or stop what uses it"
        ) from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def uvicorn_config(app: Any, config: ServerConfig, *, log_level: str = "info", **extra: Any) -> Any:
    """The uvicorn.Config `lookahead serve` runs `app` with (`extra`: e.g. host/port for tests)."""
    import uvicorn

    return uvicorn.Config(
        app,
        log_level=log_level,
        # Our own bound (below) ends in-flight requests cleanly; uvicorn's is only a backstop.
        timeout_graceful_shutdown=math.ceil(config.shutdown_timeout_s) + 10,
        limit_concurrency=config.max_connections,  # past it, uvicorn answers 503 without reading the request
        lifespan="on",
        **extra,
    )


def run(
    loaded: Any, config: ServerConfig, sock: socket.socket, *, log_level: str = "info", drafts: dict[str, Any] | None = None,
    learned: dict[str, dict[str, Any]] | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT; then stop accepting, let in-flight work end (bounded), return."""
    from lookahead.server.app import create_app

    app = create_app(loaded, config, drafts=drafts, learned=learned)
    uv_config = uvicorn_config(app, config, log_level=log_level)
    logging.getLogger("lookahead.server").setLevel(log_level.upper())
    host, port = sock.getsockname()[:2]
    print(f"lookahead: serving {loaded.name} on http://{host}:{port} (policy: {config.policy_source}; "
          f"max batch {config.max_batch})", flush=True)
    _graceful_server(uv_config, app.state.worker.cancel_all, config.shutdown_timeout_s).run(sockets=[sock])


def _graceful_server(config: Any, cancel_all: Callable[[], None], grace_s: float) -> Any:
    """A uvicorn.Server whose shutdown (on SIGTERM/SIGINT) stops accepting at once, gives in-flight
    requests grace_s to finish, then cancels them (streams get a final error event), and exits 0."""
    import uvicorn

    class GracefulServer(uvicorn.Server):
        async def shutdown(self, sockets: Any = None) -> None:
            timer = asyncio.get_running_loop().call_later(grace_s, cancel_all)
            try:
                await super().shutdown(sockets)
            finally:
                timer.cancel()

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # uvicorn's own version re-raises the signal after shutdown, which would end the process by
            # SIGTERM's default action (exit 143). Our shutdown is complete by then, so we route the
            # signals to the public handle_exit() ourselves and restore the old handlers: exit 0.
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return GracefulServer(config)
