"""The exact-kernel extension as it was at a commit (its C++ sources from git), built beside the current
one for an A/B in one process: `build(commit)` returns the loaded module."""
import subprocess, tempfile
from pathlib import Path

from torch.utils import cpp_extension

from lookahead.engine import exact_kernel

NAMES = ("exact_kernel.cpp", "prefill_kernel.cpp", "linear_kernel.cpp")


def build(commit: str):
    folder = Path(tempfile.mkdtemp())
    for name in NAMES:
        (folder / name).write_bytes(subprocess.run(["git", "show", f"{commit}:lookahead/engine/{name}"],
                                                   capture_output=True, check=True).stdout)
    return cpp_extension.load(name="lookahead_exact_ab_old", sources=[str(folder / n) for n in NAMES],
                              extra_cflags=list(exact_kernel.FLAGS), extra_ldflags=["-fopenmp"],
                              build_directory=str(folder), verbose=False)
