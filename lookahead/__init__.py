"""lookahead: lossless lookahead decoding for Hugging Face causal LMs."""

from lookahead.candidates.ngram_cache import NGramCache, NGramCacheConfig, NGramCaches
from lookahead.config import GenerationConfig, LookaheadConfig, PromptLookupConfig, SamplingConfig, SpeculativeConfig
from lookahead.engine import STRATEGIES, GenerationResult, GenerationStats, StepEvent, generate, stream, stream_events
from lookahead.errors import ConfigError, LookaheadError, ModelNotFoundError, PromptError
from lookahead.models import DEFAULT_MODEL, LoadedModel, load

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MODEL",
    "STRATEGIES",
    "ConfigError",
    "GenerationConfig",
    "GenerationResult",
    "GenerationStats",
    "LoadedModel",
    "LookaheadConfig",
    "LookaheadError",
    "ModelNotFoundError",
    "NGramCache",
    "NGramCacheConfig",
    "NGramCaches",
    "PromptError",
    "PromptLookupConfig",
    "SamplingConfig",
    "SpeculativeConfig",
    "StepEvent",
    "generate",
    "load",
    "stream",
    "stream_events",
]
