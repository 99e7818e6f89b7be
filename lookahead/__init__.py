"""lookahead: lossless lookahead decoding for Hugging Face causal LMs.

The public names below are imported on first use (PEP 562), so `import lookahead.config` or
`import lookahead.policy` stays light: torch and transformers load only when a name that
needs them (`load`, `generate`, ...) is touched.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "NGramCache": "lookahead.candidates.ngram_cache",
    "NGramCacheConfig": "lookahead.candidates.ngram_cache",
    "NGramCaches": "lookahead.candidates.ngram_cache",
    "GenerationConfig": "lookahead.config",
    "LookaheadConfig": "lookahead.config",
    "PromptLookupConfig": "lookahead.config",
    "SamplingConfig": "lookahead.config",
    "SpeculativeConfig": "lookahead.config",
    "STRATEGIES": "lookahead.config",
    "GenerationResult": "lookahead.generation",
    "GenerationStats": "lookahead.generation",
    "StepEvent": "lookahead.generation",
    "generate": "lookahead.generation",
    "stream": "lookahead.generation",
    "stream_events": "lookahead.generation",
    "load_learned": "lookahead.learned",
    "save_learned": "lookahead.learned",
    "ConfigError": "lookahead.errors",
    "LookaheadError": "lookahead.errors",
    "ModelNotFoundError": "lookahead.errors",
    "PromptError": "lookahead.errors",
    "DEFAULT_MODEL": "lookahead.models",
    "LoadedModel": "lookahead.models",
    "load": "lookahead.models",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        if not name.startswith("_") and importlib.util.find_spec(f"lookahead.{name}") is not None:
            return importlib.import_module(f"lookahead.{name}")  # `lookahead.config.X` after `import lookahead`
        raise AttributeError(f"module 'lookahead' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value
# (No public name equals a submodule's name: importing lookahead.X sets attribute X on this package.)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:
    from lookahead.candidates.ngram_cache import NGramCache, NGramCacheConfig, NGramCaches
    from lookahead.config import (
        GenerationConfig,
        LookaheadConfig,
        PromptLookupConfig,
        SamplingConfig,
        SpeculativeConfig,
    )
    from lookahead.config import STRATEGIES
    from lookahead.generation import (
        GenerationResult,
        GenerationStats,
        StepEvent,
        generate,
        stream,
        stream_events,
    )
    from lookahead.errors import ConfigError, LookaheadError, ModelNotFoundError, PromptError
    from lookahead.learned import load_learned, save_learned
    from lookahead.models import DEFAULT_MODEL, LoadedModel, load
