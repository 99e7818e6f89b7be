"""Every module imports on its own, whichever is imported first (no import cycles), and the light
modules stay light."""

from __future__ import annotations

import subprocess
import sys

# One interpreter: third-party packages stay loaded, but every lookahead module is dropped before the
# next one is imported, so each import starts from a clean lookahead namespace, as a user's would.
SCRIPT = r"""
import importlib, pkgutil, sys
import lookahead
names = sorted(m.name for m in pkgutil.walk_packages(lookahead.__path__, "lookahead.")
               if not m.name.endswith("__main__"))
failed = []
for name in names:
    for loaded in [m for m in sys.modules if m == "lookahead" or m.startswith("lookahead.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed.append(f"{name}: {type(exc).__name__}: {exc}")
print(len(names))
print("\n".join(failed))
"""


def test_every_module_imports_first() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    count, *failures = out.stdout.strip().splitlines()
    assert int(count) > 40  # the walk found the package's modules
    assert not failures, "\n".join(failures)


# Each public name, imported first in a clean namespace, is the object itself: not a submodule that
# happens to share its name (importing lookahead.X sets attribute X on the package).
NAMES_SCRIPT = r"""
import importlib, sys, types
import lookahead
public = [("lookahead", n) for n in lookahead.__all__]
bad = []
for package, first in public:
    for loaded in [m for m in sys.modules if m == "lookahead" or m.startswith("lookahead.")]:
        del sys.modules[loaded]
    module = importlib.import_module(package)
    getattr(module, first)  # this name is touched first, then every other one is checked
    for name in module.__all__:
        if isinstance(getattr(module, name), types.ModuleType):
            bad.append(f"{package}.{name} is a module when {first} is touched first")
print("\n".join(bad))
"""


def test_public_names_are_never_shadowed_by_submodules() -> None:
    out = subprocess.run([sys.executable, "-c", NAMES_SCRIPT], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", out.stdout
    code = "from lookahead.generation import StepEvent, generate; print(callable(generate))"
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert fresh.stdout.strip() == "True"


def test_importing_the_package_does_not_load_torch() -> None:
    code = ("import sys, lookahead; print('torch' in sys.modules, lookahead.LookaheadConfig().window, "
            "lookahead.config.SamplingConfig().greedy)")  # submodules stay reachable as attributes
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split()[0] == "False"
