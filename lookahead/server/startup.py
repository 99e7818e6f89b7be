"""What the server loads and checks once, at start: the model, the policy's draft models, API keys.

Everything here runs before the first request, so an operator's mistake stops the server with one
line (exit code 2) instead of reaching a client, and no request ever waits for a model load.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lookahead.config import SpeculativeConfig
from lookahead.errors import ConfigError, LookaheadError
from lookahead.policy import Policy
from lookahead.server.config import ALL_CLASSES, CLASS_RE

TINY_PREFIX = "tiny:"  # test-only model names, e.g. tiny:llama (a random in-process model; see docs/server.md)

LoadFn = Callable[[str, Any], Any]  # (name or path, torch dtype) -> LoadedModel


def load_model(name: str | None, dtype: Any, pack: bool = True) -> Any:
    """The model to serve. `tiny:ARCH` builds the tests' random model (no download, instant). `pack`:
    linear weights packed once where that costs no exactness (models/packing.py)."""
    import lookahead

    return lookahead.load(name or lookahead.DEFAULT_MODEL, dtype=dtype, pack=pack)


def load_policy_drafts(policy: Policy, target: Any, load: LoadFn = load_model) -> dict[str, Any]:
    """Load every draft model the policy names (self-drafts need none) in the target's dtype, and
    check that it tokenizes like the target. Returns {draft name: LoadedModel}; raises ConfigError
    naming the policy entry. The message is for the operator's terminal only."""
    from lookahead.models.drafts import check_same_tokenizer

    drafts: dict[str, Any] = {}
    for where, decision in policy.decisions():
        spec = decision.config
        if not isinstance(spec, SpeculativeConfig) or spec.is_self_draft or spec.draft in drafts:
            continue
        try:
            draft = load(spec.draft, target.dtype)
            check_same_tokenizer(target, draft)
        except (LookaheadError, ValueError, OSError) as exc:
            raise ConfigError(f"policy {where}: draft model {spec.draft!r} cannot be used: {exc}") from None
        drafts[spec.draft] = draft
    return drafts


def shown_draft(name: str) -> str:
    """A draft as clients may see it: a filesystem path shrinks to its last part."""
    looks_like_path = os.path.isabs(name) or name.startswith((".", "~")) or os.path.exists(name)
    return Path(name).name if looks_like_path else name


def public_policy(policy: Policy) -> dict[str, Any]:
    """Policy.to_dict() without server paths (for GET /v1/policy)."""
    data = policy.to_dict()
    entries = [data["default"], *data["classes"].values(), *data["rules"]]
    for entry in entries:
        spec = entry.get("speculative")
        if spec is not None:
            spec["draft"] = shown_draft(spec["draft"])
    return data


def load_api_keys(path: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Read an API key file: one key a line, optionally followed by the n-gram cache classes it may
    use, comma-separated ("*" for all). Blank lines and lines starting with '#' are skipped:

        sk-team-a   code,json
        sk-team-b   chat
        sk-ops      *
        sk-guest

    Errors name the line, never the key."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the API key file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    keys: list[tuple[str, tuple[str, ...]]] = []
    seen: set[str] = set()
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        if len(fields) > 2:
            raise ConfigError(f"{path}:{number}: write KEY or KEY CLASS[,CLASS...] (no spaces between classes)")
        key = fields[0]
        classes = tuple(c for c in fields[1].split(",") if c) if len(fields) == 2 else ()
        bad = [c for c in classes if c != ALL_CLASSES and not CLASS_RE.fullmatch(c)]
        if bad:
            raise ConfigError(f"{path}:{number}: {bad[0][:80]!r} is not a class name (letters, digits, _ . : -) or '*'")
        if key in seen:
            raise ConfigError(f"{path}:{number}: this key is already listed; give each key once, with all its classes")
        seen.add(key)
        keys.append((key, classes))
    if not keys:
        raise ConfigError(f"the API key file {path} lists no key; add one key per line")
    return tuple(keys)
