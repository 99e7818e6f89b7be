"""Small JSON files under the cache (measured verdicts per model and device): read leniently, written
atomically. A missing, corrupt or read-only file only costs a re-measurement."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def cache_root() -> Path:
    """Where lookahead keeps what it converts, measures and builds: $LOOKAHEAD_CACHE, else ~/.cache/lookahead."""
    return Path(os.environ.get("LOOKAHEAD_CACHE", Path.home() / ".cache" / "lookahead"))


def read_json(path: Path) -> dict[str, Any]:
    """The file's object, or {} when it is missing, unreadable or not a JSON object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def update_json(path: Path, key: str, value: Any) -> None:
    """Set `key` in the file's object and write it back atomically (rename); errors are ignored."""
    data = read_json(path)
    data[key] = value
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError:
        pass


def write_private_json(path: Path, data: Any) -> None:
    """Write `data` to `path` owner-only (mkstemp's mode: users' text or statistics of it) and atomically:
    a temp file of its own per call (two writers never share one), renamed over the file, removed on
    failure, so a crash never leaves half a file. Errors (OSError) are the caller's to report."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(data, separators=(",", ":")))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
