"""Errors that tell the user what to do. The CLI prints their message on one line and exits 2."""

from __future__ import annotations


class LookaheadError(Exception):
    """Base class for every error this package raises on purpose."""


class ConfigError(LookaheadError, ValueError):
    """A configuration value is out of range (W, N, G, temperature, top-p, ...)."""


class ModelNotFoundError(LookaheadError):
    """A model name or path could not be resolved or read."""


class PromptError(LookaheadError, ValueError):
    """The prompt is empty or does not fit in the model's context."""
