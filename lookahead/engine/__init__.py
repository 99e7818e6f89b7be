"""The decoding engine: one shared step routine, candidate sources plugged in by strategy name.

Names are imported on first use, so a candidate source can import `lookahead.engine.draft` (the
interface it implements) without pulling in the generation loop, which imports the sources.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lookahead.config import STRATEGIES

_LAZY = ("GenerationResult", "GenerationStats", "StepEvent", "generate", "stream", "stream_events")

__all__ = ["STRATEGIES", *_LAZY]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'lookahead.engine' has no attribute {name!r}")
    # (The loop lives in generation.py, not generate.py: importing a submodule sets an attribute of
    # the same name on this package, which would shadow the function `generate`.)
    module = importlib.import_module("lookahead.engine.generation")
    for lazy in _LAZY:
        globals()[lazy] = getattr(module, lazy)
    return globals()[name]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


if TYPE_CHECKING:
    from lookahead.engine.generation import GenerationResult, GenerationStats, StepEvent, generate, stream, stream_events
