"""OpenAI-compatible HTTP server (`lookahead serve`). See docs/server.md.

`create_app` and `ServerConfig` are imported lazily, so `import lookahead.server` alone does not pull in
FastAPI. The policy file format the server reads (`--policy`) lives in `lookahead.policy`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ServerConfig", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from lookahead.server.app import create_app

        return create_app
    if name == "ServerConfig":
        from lookahead.server.config import ServerConfig

        return ServerConfig
    raise AttributeError(f"module 'lookahead.server' has no attribute {name!r}")
