"""The workload format: JSONL, one request a line. See docs/workloads.md.

Each line is an object with ``id``, ``class`` and exactly one of ``messages`` (a chat, sent through
the model's chat template) or ``prompt`` (raw text, continued as-is). Optional: ``max_tokens``,
``temperature``, ``top_p``, ``top_k``, ``seed``, ``meta``. Unknown fields are ignored. Every
problem is reported with its file and line number; no line is ever dropped silently.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lookahead.config import is_int
from lookahead.errors import LookaheadError

CLASS_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
ROLES = ("system", "user", "assistant", "tool")
MAX_REPORTED_ERRORS = 20


class WorkloadError(LookaheadError, ValueError):
    """A workload file is missing, unreadable or has invalid lines (each named by file:line)."""


@dataclass(frozen=True)
class Request:
    """One benchmark request, validated."""

    id: str
    cls: str
    messages: tuple[tuple[str, str], ...] | None = None
    prompt: str | None = None
    max_tokens: int | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    source: str = ""

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.prompt is None):
            raise WorkloadError(f"request {self.id!r}: give exactly one of 'messages' or 'prompt'")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def effective_seed(self) -> int:
        """The request's seed, or a stable one derived from its id when it gives none."""
        if self.seed is not None:
            return self.seed
        return int.from_bytes(hashlib.sha256(self.id.encode("utf-8")).digest()[:7], "big")

    def chat(self) -> list[dict[str, str]]:
        """The messages as the list of dicts a chat template expects."""
        if self.messages is None:
            raise WorkloadError(f"request {self.id!r} is a raw prompt, not a chat")
        return [{"role": r, "content": c} for r, c in self.messages]

    def to_json(self) -> dict[str, Any]:
        """The request as a workload line (round-trips through parse_line)."""
        out: dict[str, Any] = {"id": self.id, "class": self.cls}
        if self.messages is not None:
            out["messages"] = self.chat()
        else:
            out["prompt"] = self.prompt
        if self.max_tokens is not None:
            out["max_tokens"] = self.max_tokens
        if self.temperature != 0.0:
            out["temperature"] = self.temperature
        if self.top_p != 1.0:
            out["top_p"] = self.top_p
        if self.top_k != 0:
            out["top_k"] = self.top_k
        if self.seed is not None:
            out["seed"] = self.seed
        if self.meta:
            out["meta"] = self.meta
        return out



def _is_number(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def _parse_messages(value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise ValueError("'messages' must be a non-empty list of {\"role\", \"content\"} objects")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError(f"messages[{i}] must be an object with 'role' and 'content'")
        role, content = m["role"], m["content"]
        if role not in ROLES:
            raise ValueError(f"messages[{i}].role is {role!r}; use one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be a string")
        out.append((role, content))
    if not any(c.strip() for _, c in out):
        raise ValueError("'messages' has no text in it")
    return tuple(out)


def parse_line(obj: Any, *, classes: Collection[str] | None = None, source: str = "") -> Request:
    """Validate one decoded JSON line. Raises ValueError with a message naming the bad field."""
    if not isinstance(obj, dict):
        raise ValueError(f"a line must be a JSON object, got {type(obj).__name__}")
    missing = [k for k in ("id", "class") if k not in obj]
    if "messages" not in obj and "prompt" not in obj:
        missing.append("messages or prompt")
    if missing:
        raise ValueError(f"missing field(s): {', '.join(missing)}")
    rid = obj["id"]
    if not (isinstance(rid, str) and rid.strip()) and not is_int(rid):
        raise ValueError("'id' must be a non-empty string or an integer")
    cls = obj["class"]
    if not isinstance(cls, str) or not CLASS_RE.match(cls):
        raise ValueError(f"'class' must be a short name of letters, digits, '_', '-', '.', got {cls!r}")
    if classes is not None and cls not in classes:
        raise ValueError(f"unknown class {cls!r}; this workload's classes are {', '.join(sorted(classes))}")
    if "messages" in obj and "prompt" in obj:
        raise ValueError("give either 'messages' or 'prompt', not both")
    messages = prompt = None
    if "messages" in obj:
        messages = _parse_messages(obj["messages"])
    else:
        prompt = obj["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("'prompt' must be a non-empty string")
    max_tokens = obj.get("max_tokens")
    if max_tokens is not None and (not is_int(max_tokens) or max_tokens < 1):
        raise ValueError(f"'max_tokens' must be an integer >= 1, got {max_tokens!r}")
    temperature = _checked(obj, "temperature", 0.0, lambda v: _is_number(v) and v >= 0, "a number >= 0")
    top_p = _checked(obj, "top_p", 1.0, lambda v: _is_number(v) and 0.0 < v <= 1.0, "a number in (0, 1]")
    top_k = _checked(obj, "top_k", 0, lambda v: is_int(v) and v >= 0, "an integer >= 0 (0 disables it)")
    seed = obj.get("seed")
    if seed is not None and (not is_int(seed) or not (0 <= seed < 2**63)):
        raise ValueError(f"'seed' must be an integer in [0, 2**63), got {seed!r}")
    meta = obj.get("meta") or {}
    if not isinstance(meta, dict):
        raise ValueError("'meta' must be an object")
    return Request(
        id=str(rid), cls=cls, messages=messages, prompt=prompt, max_tokens=max_tokens,
        temperature=float(temperature), top_p=float(top_p), top_k=top_k, seed=seed, meta=meta,
        source=source,
    )


def _checked(obj: dict[str, Any], key: str, default: Any, ok: Callable[[Any], bool], what: str) -> Any:
    """obj[key] (absent or null: `default`), or a ValueError naming the field and what it must be."""
    value = obj.get(key)
    if value is None:
        return default
    if not ok(value):
        raise ValueError(f"'{key}' must be {what}, got {value!r}")
    return value


def parse_lines(lines: Iterable[str], *, name: str = "<workload>",
                classes: Collection[str] | None = None) -> list[Request]:
    """Parse JSONL text. Blank lines are skipped; every other bad line is an error, all reported."""
    requests: list[Request] = []
    errors: list[str] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            errors.append(f"{name}:{lineno}: not valid JSON ({exc.msg} at column {exc.colno})")
            continue
        try:
            requests.append(parse_line(obj, classes=classes, source=f"{name}:{lineno}"))
        except (ValueError, WorkloadError) as exc:
            errors.append(f"{name}:{lineno}: {exc}")
    if errors:
        shown = errors[:MAX_REPORTED_ERRORS]
        more = len(errors) - len(shown)
        tail = f"\n  ... and {more} more" if more else ""
        raise WorkloadError(
            f"{len(errors)} invalid line(s) in {name}; fix or remove them:\n  " + "\n  ".join(shown) + tail
        )
    return requests


def parse_workload(path: str | Path, *, classes: Collection[str] | None = None) -> list[Request]:
    """Read one JSONL workload file."""
    p = Path(path)
    if not p.is_file():
        raise WorkloadError(f"workload file {p} does not exist; build one with `lookahead workloads build`")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"cannot read workload {p}: {exc}") from exc
    return parse_lines(text.splitlines(), name=str(p), classes=classes)


def manifest_classes(directory: Path) -> set[str] | None:
    """Classes a built workload directory declares in its manifest.json (None without one)."""
    mf = directory / "manifest.json"
    if not mf.is_file():
        return None
    try:
        data = json.loads(mf.read_text(encoding="utf-8"))
        return {str(s["class"]) for s in data["sources"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise WorkloadError(f"{mf} is not a valid workload manifest ({exc}); rebuild the directory") from exc


def load_workloads(paths: Sequence[str | Path]) -> list[Request]:
    """Read workload files and directories (every *.jsonl inside; classes checked against the
    directory's manifest.json when it has one). Request ids must be unique across all of them."""
    if not paths:
        raise WorkloadError("no workload given; pass --workload FILE_OR_DIR")
    out: list[Request] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            files = sorted(f for f in p.glob("*.jsonl") if f.is_file())
            if not files:
                raise WorkloadError(f"{p} has no *.jsonl files; build one with `lookahead workloads build --out {p}`")
            allowed = manifest_classes(p)
            for f in files:
                out.extend(parse_workload(f, classes=allowed))
        else:
            out.extend(parse_workload(p))
    seen: dict[str, str] = {}
    dups = []
    for r in out:
        if r.id in seen:
            dups.append(f"{r.id!r} at {r.source} (first at {seen[r.id]})")
        else:
            seen[r.id] = r.source
    if dups:
        raise WorkloadError("duplicate request ids; make every id unique:\n  " + "\n  ".join(dups[:MAX_REPORTED_ERRORS]))
    return out
