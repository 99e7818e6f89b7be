"""Model loading: embedded GGUF models from PyPI packages, HF folders, .gguf files."""

from lookahead.models.loader import LoadedModel, load, wrap
from lookahead.models.registry import DEFAULT_MODEL, EMBEDDED

__all__ = ["DEFAULT_MODEL", "EMBEDDED", "LoadedModel", "load", "wrap"]
