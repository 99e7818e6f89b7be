"""Draft models for speculative decoding: resolve "self:L" or a model name, and check the tokenizer.

A draft must map text to the same token ids as the target: its guesses are compared with the
target's choices id by id. `check_same_tokenizer` compares the vocabularies and a few encodings.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from lookahead.config import SpeculativeConfig
from lookahead.errors import ConfigError
from lookahead.models.loader import LoadedModel, load
from lookahead.models.self_draft import SelfDraft

# Texts whose encodings must agree: ASCII prose, code with indentation, digits, accents, CJK, emoji.
PROBES = ("Hello, world! How are you today?", "def f(x):\n    return x * 2\n", "12345 + 67890 = 80235",
          "naïve café, Zürich", "東京タワー", "🙂 ok\t\tend")
_DRAFT_HINT = "speculative decoding needs a draft with the target's tokenizer: pick one of the same model family or use --draft self:L"


def check_same_tokenizer(target: LoadedModel, draft: LoadedModel) -> None:
    """Raise ConfigError unless `draft` tokenizes exactly like `target`."""
    tv, dv = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    if tv != dv:
        differs = sorted(set(tv.items()) ^ set(dv.items()), key=lambda kv: kv[1])[:3]
        raise ConfigError(
            f"draft {draft.name!r} does not share the tokenizer of {target.name!r} (vocabularies of {len(dv)} and "
            f"{len(tv)} tokens; e.g. {', '.join(f'{t!r}->{i}' for t, i in differs)}); {_DRAFT_HINT}"
        )
    for text in PROBES:
        a = target.tokenizer(text, add_special_tokens=False)["input_ids"]
        b = draft.tokenizer(text, add_special_tokens=False)["input_ids"]
        if list(a) != list(b):
            raise ConfigError(f"draft {draft.name!r} encodes {text!r} as {list(b)[:8]}, the target as {list(a)[:8]}; "
                              f"{_DRAFT_HINT}")


def resolve_draft(target: LoadedModel, cfg: SpeculativeConfig, draft: LoadedModel | None = None,
                  needed_context: int = 0) -> Any:
    """The module that drafts: `draft`'s model if given (checked), a SelfDraft for "self[:L]", else
    the model `cfg.draft` names, loaded once per (name, dtype) and checked. `needed_context`: the
    positions this request may reach (prompt + max_new_tokens + k)."""
    if draft is None and cfg.is_self_draft:
        layers = int(getattr(target.model.config, "num_hidden_layers", 0) or 0)
        return SelfDraft(target.model, cfg.self_draft_layers(layers))
    if draft is None:
        draft = _load_cached(cfg.draft, target.dtype)
    if draft.model is not target.model:
        check_same_tokenizer(target, draft)
    if draft.context_length < needed_context:
        raise ConfigError(f"draft {draft.name!r} has a context of {draft.context_length} tokens but this request may "
                          f"reach {needed_context}; shorten the prompt or max_new_tokens, or use a self-draft")
    return draft.model


@functools.lru_cache(maxsize=2)
def _load_cached(name: str, dtype: torch.dtype) -> LoadedModel:
    return load(name, dtype=dtype)
