"""Package layering: the benchmark does not depend on the server; the policy file format
(lookahead.policy), which both of them use, depends on neither of them nor on the engine; and the
engine defines the candidate-source interface but never imports a source (no engine<->candidates cycle)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import lookahead.bench
import lookahead.engine

# Imports lookahead.bench and every module under it, then lists every lookahead module that got loaded.
BENCH_SCRIPT = r"""
import importlib, json, pkgutil, sys
import lookahead.bench
walked = sorted(m.name for m in pkgutil.walk_packages(lookahead.bench.__path__, "lookahead.bench."))
for name in walked:
    importlib.import_module(name)
print(json.dumps({"walked": walked, "loaded": sorted(m for m in sys.modules if m.startswith("lookahead"))}))
"""

POLICY_SCRIPT = r"""
import json, sys
import lookahead.policy
print(json.dumps(sorted(sys.modules)))
"""


def _run(script: str) -> object:
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_importing_the_bench_loads_no_server_module() -> None:
    result = _run(BENCH_SCRIPT)
    assert isinstance(result, dict)
    walked, loaded = result["walked"], result["loaded"]
    # The walk did find the bench's modules, including the two that use the policy format.
    assert {"lookahead.bench.policy", "lookahead.bench.variants", "lookahead.bench.cli"} <= set(walked)
    assert "lookahead.policy" in loaded
    server = [m for m in loaded if _under(m, "lookahead.server")]
    assert not server, f"importing lookahead.bench loaded server modules: {server}"


def _imports_of(package: object, forbidden: str) -> list[str]:
    """file:line of every import of `forbidden` (or a module under it) in the package's sources,
    imports inside functions included (an import-time check cannot see those)."""
    offenders = []
    for path in sorted(Path(package.__path__[0]).rglob("*.py")):  # type: ignore[attr-defined]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            if any(_under(n, forbidden) for n in names):
                offenders.append(f"{path.name}:{node.lineno}")
    return offenders


def test_bench_sources_never_import_the_server() -> None:
    offenders = _imports_of(lookahead.bench, "lookahead.server")
    assert not offenders, f"lookahead.bench imports lookahead.server at {', '.join(offenders)}"


def test_the_engine_never_imports_a_candidate_source_or_the_generation_loop() -> None:
    for upper in ("lookahead.candidates", "lookahead.generation", "lookahead.server", "lookahead.bench"):
        offenders = _imports_of(lookahead.engine, upper)
        assert not offenders, f"lookahead.engine imports {upper} at {', '.join(offenders)}"


def test_the_policy_module_loads_neither_the_server_nor_the_engine() -> None:
    loaded = _run(POLICY_SCRIPT)
    assert isinstance(loaded, list)
    assert "lookahead.policy" in loaded
    heavy_packages = ("lookahead.server", "lookahead.engine", "lookahead.candidates", "lookahead.models",
                      "lookahead.generation", "lookahead.bench", "torch", "transformers", "fastapi")
    heavy = [m for m in loaded if any(_under(m, p) for p in heavy_packages)]
    assert not heavy, f"importing lookahead.policy loaded {heavy}"
