"""The decoding engine: one shared step routine, candidate sources plugged in by strategy name."""

from lookahead.config import STRATEGIES
from lookahead.engine.generate import GenerationResult, GenerationStats, StepEvent, generate, stream, stream_events

__all__ = ["STRATEGIES", "GenerationResult", "GenerationStats", "StepEvent", "generate", "stream", "stream_events"]
