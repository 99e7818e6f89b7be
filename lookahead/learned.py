"""What requests learned, kept across processes: a model's shared calibrators and recycled successors.

Within a process, the requests on one model share per label (strategy and decoding mode, or request
class) how often each source's guesses are accepted and which tokens the model predicts after which
(engine/shared.py). A new process starts with neither: a command-line one-shot, or a server after a
restart, verifies short chains from the priors and has no recycled successors for its first tokens.
`save_learned` writes what this process's requests learned on a model to a file; `load_learned` makes
a file's objects the ones the model's requests share from then on. Tokens never depend on either (every
token is verified); how many a step accepts does.

The file holds statistics of the text the model produced (which token followed which), so it is
written owner-only, like the n-gram cache file. It names the model it was learned on (name,
vocabulary size): successors of another vocabulary would be wrong guesses, so such a file is refused.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lookahead.cachefile import write_private_json
from lookahead.candidates.recycling import SuccessorTable
from lookahead.engine.calibration import Calibrator
from lookahead.engine.shared import put_shared, shared_items
from lookahead.errors import ConfigError

FILE_VERSION = 1
KINDS = {"calibrator": Calibrator, "successors": SuccessorTable}  # the shared kinds a file keeps


def identity(loaded: Any) -> dict[str, Any]:
    """What a file must match to be used on `loaded`: its name and vocabulary size."""
    return {"model": loaded.name, "vocab": int(loaded.model.get_output_embeddings().weight.shape[0])}


def export_learned(loaded: Any) -> dict[str, dict[str, Any]]:
    """{label: {kind: object}} for every calibrator and successor table shared on `loaded`'s model."""
    out: dict[str, dict[str, Any]] = {}
    for (kind, label), obj in sorted(shared_items(loaded.model).items()):
        if kind in KINDS and isinstance(obj, KINDS[kind]):
            out.setdefault(label, {})[kind] = obj
    return out


def save_learned(loaded: Any, path: str | Path) -> None:
    """Write what requests on `loaded` learned in this process to `path` (atomically, owner-only)."""
    write_learned(loaded, path, export_learned(loaded))


def load_learned(loaded: Any, path: str | Path) -> list[str]:
    """Restore what `save_learned` wrote for this model: requests on `loaded` share the file's
    calibrators and successor tables from now on. Returns the labels restored. A missing, unreadable,
    malformed or foreign file raises ConfigError saying what to do, and restores nothing."""
    learned = read_learned(loaded, path)
    for label, kinds in learned.items():
        for kind, obj in kinds.items():
            put_shared(loaded.model, kind, label, obj)
    return sorted(learned)


def write_learned(loaded: Any, path: str | Path, learned: Mapping[str, Mapping[str, Any]]) -> None:
    """Write {label: {kind: Calibrator or SuccessorTable}} for `loaded` to `path`, leaving out what has
    learned nothing (atomically: a crash never leaves half a file; owner-only)."""
    path = Path(path)
    labels = {label: {kind: obj.to_json() for kind, obj in kinds.items() if _learned_something(obj)}
              for label, kinds in learned.items()}
    data = {"version": FILE_VERSION, **identity(loaded), "labels": {k: v for k, v in labels.items() if v}}
    write_private_json(path, data)


def check_learned_file(path: str | Path) -> dict[str, Any]:
    """Before a model loads: `path`'s folder is writable (it is written back), and the file, where it
    exists, is a readable learned-state file of this version. Returns its contents ({} when absent).
    ConfigError otherwise, saying what to do."""
    path = Path(path)
    folder = path.absolute().parent
    if path.is_dir() or not folder.is_dir() or not os.access(folder, os.W_OK):
        raise ConfigError(f"cannot write the learned-state file {path}: give a file in a writable folder")
    return _read_file(path) if path.exists() else {}


def _read_file(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read learned-state file {path}: {exc}; delete it or point to another one") from None
    if not isinstance(data, dict) or data.get("version") != FILE_VERSION or not isinstance(data.get("labels"), dict):
        raise ConfigError(f"{path} is not a version-{FILE_VERSION} learned-state file; delete it or point to another one")
    return data


def read_learned(loaded: Any, path: str | Path) -> dict[str, dict[str, Any]]:
    """{label: {kind: object}} from a file `write_learned` wrote for this model; ConfigError otherwise."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"no learned-state file at {path}; save one first or drop the option")
    data = _read_file(path)
    mine = identity(loaded)
    theirs = {k: data.get(k) for k in mine}
    if theirs != mine:
        raise ConfigError(f"{path} was learned on {theirs['model']} (vocabulary {theirs['vocab']}), not on "
                          f"{mine['model']} (vocabulary {mine['vocab']}); use a file per model")
    vocab = mine["vocab"]
    out: dict[str, dict[str, Any]] = {}
    try:
        for label, kinds in data["labels"].items():
            if not isinstance(label, str) or not isinstance(kinds, dict):
                raise ValueError(f"label {label!r} holds {type(kinds).__name__}, not a mapping of kinds")
            for kind, state in kinds.items():
                if kind == "calibrator":
                    out.setdefault(label, {})[kind] = Calibrator.from_json(state)
                elif kind == "successors":
                    out.setdefault(label, {})[kind] = SuccessorTable.from_json(state, vocab)
                else:
                    raise ValueError(f"unknown kind {kind!r}")
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{path} is not valid learned state ({type(exc).__name__}: {exc}); "
                          "delete the file or point to another one") from None
    return out


def _learned_something(obj: Any) -> bool:
    return not obj.empty if isinstance(obj, Calibrator) else len(obj) > 0 or bool(obj.contexts)
