"""The exact attention's C++ kernel (engine/exact_kernel.cpp): built on first use for this machine, or
not at all, in which case exact passes keep their two-matmul path (engine/attention.py).

Why: in bfloat16 on CPU each of the exact attention's two small matmuls costs 25-50 us in oneDNN's
per-call overhead, whatever its size, so a one-row exact step paid ~3 ms (8%) more than PyTorch's fused
attention. The kernel does both products in a fixed order per output (see the .cpp's header), so its
rows are exact by construction, and costs a few microseconds per call at small widths.

It serves bfloat16 passes only (the dtype whose matmul overhead it removes, measured); float32 and
float64 keep the matmul path. It is built with the machine's compiler (g++ or whatever torch's extension
builder finds, through ninja) into $LOOKAHEAD_CACHE/kernels/<hash>, where the hash covers the source,
the flags, the CPU and torch's version, and is loaded from there afterwards. Set LOOKAHEAD_EXACT_KERNEL=0
to run without it. Either way the choice is fixed per process, and `status()` names it in the device
signature, so cached width probes and cost curves never mix the two.

The same extension carries the prefill's causal attention for bfloat16 (engine/prefill_kernel.cpp,
where the compiler targets AVX-512 BF16): a prompt into an empty cache runs it instead of PyTorch's
SDPA (`prefills`), 2.2-3.7x faster on SmolLM2's heads on 2 Zen 4 cores. Its rows are not exact in the
sense above and need not be (see the .cpp's header). LOOKAHEAD_PREFILL_KERNEL=0 keeps SDPA for prompts.

And it carries a bfloat16 linear layer (engine/linear_kernel.cpp, AVX-512 BF16 again) whose rows are exact
at any row count: models/packing.py runs the model's linears on it where `tiles` says so, 1.3-1.5x faster
than oneDNN's at a decode pass's 1-8 rows on 2 Zen 4 cores. LOOKAHEAD_LINEAR_KERNEL=0 keeps oneDNN's.

And two pieces of a Llama layer for models/lean.py (engine/lean_kernel.cpp, plain C++): q and k rotated,
and a norm scaled once its variance is taken, each in one call with the bits of PyTorch's operations.

And each row's k largest logits in one pass (engine/topk_kernel.cpp, plain C++ with AVX-512 where the
compiler targets it), for the step's recycled successors and greedy choice (engine/sampling.py).

And PyTorch's CPU uniform draws without its per-value generator calls (engine/uniform_kernel.cpp), for
the seeded sampling rule's noise (engine/sampling.py), and that rule's choice decided from those draws
without the noise row where bounds on it settle the choice (engine/gumbel_kernel.cpp).
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import threading
from pathlib import Path
from typing import Any

import torch

from lookahead.cachefile import cache_root

ENV = "LOOKAHEAD_EXACT_KERNEL"
PREFILL_ENV = "LOOKAHEAD_PREFILL_KERNEL"
SOURCE = Path(__file__).with_name("exact_kernel.cpp")  # the bindings: the extension's module
PREFILL_SOURCE = Path(__file__).with_name("prefill_kernel.cpp")
LINEAR_ENV = "LOOKAHEAD_LINEAR_KERNEL"
LINEAR_SOURCE = Path(__file__).with_name("linear_kernel.cpp")
SCORES_SOURCE = Path(__file__).with_name("scores_kernel.cpp")
LEAN_SOURCE = Path(__file__).with_name("lean_kernel.cpp")
TOPK_SOURCE = Path(__file__).with_name("topk_kernel.cpp")
UNIFORM_SOURCE = Path(__file__).with_name("uniform_kernel.cpp")
GUMBEL_SOURCE = Path(__file__).with_name("gumbel_kernel.cpp")
HEADERS = [Path(__file__).with_name("rows.h")]  # included by the sources above: part of the build's tag
# -march=native: the build is for this machine's vector width (the cache key includes its CPU);
# no -ffast-math: sums must run in source order.
FLAGS = ("-O3", "-march=native", "-fopenmp")
DTYPES = (torch.bfloat16,)
HEAD_SIZES = (16, 32, 64, 128, 256)

log = logging.getLogger(__name__)
_lock = threading.Lock()
_built: dict[str, Any] = {}  # "module": the loaded extension or None, "why": why not


def enabled(env: str = ENV) -> bool:
    """Not switched off by LOOKAHEAD_EXACT_KERNEL=0 (or false/off/no; `env`: another switch)."""
    return os.environ.get(env, "1").strip().lower() not in ("0", "false", "off", "no")


def kernel() -> Any | None:
    """The loaded extension, building it on first call; None where it is off or does not build (the
    reason is logged once and given by `status`)."""
    if "module" in _built:  # decided: no lock (exact attention asks twice a layer)
        return _built["module"]
    with _lock:
        if "module" not in _built:
            _built["module"], _built["why"] = _build() if enabled() else (None, f"off ({ENV}=0)")
            if _built["module"] is None and enabled():
                log.warning("lookahead: the exact-attention kernel is unavailable (%s); exact bfloat16 passes use "
                            "two matmuls instead (correct, ~8%% slower a step). Install a C++ compiler and "
                            "ninja to get it.", _built["why"])
        return _built["module"]


def serves(dtype: torch.dtype, head_dim: int) -> bool:
    """Do exact passes of this dtype and head size run on the kernel?"""
    return dtype in DTYPES and head_dim in HEAD_SIZES and kernel() is not None


def prefills(dtype: torch.dtype, head_dim: int) -> bool:
    """Do prompts of this dtype and head size run the kernel's causal attention (prefill_kernel.cpp)?"""
    if dtype != torch.bfloat16 or head_dim % 16 or head_dim > 256 or not enabled(PREFILL_ENV):
        return False
    module = kernel()
    return module is not None and bool(module.prefill_supported())


def tiles(dtype: torch.dtype) -> bool:
    """Do linear layers of this dtype run on the kernel's tiled linear (linear_kernel.cpp)?"""
    if dtype != torch.bfloat16 or not enabled(LINEAR_ENV):
        return False
    module = kernel()
    return module is not None and bool(module.linear_supported())


def loaded() -> Any | None:
    """The extension where an earlier call already built or loaded it, else None (never builds: a model
    that needs none of its kernels, float32 say, does not pay a compile for a helper)."""
    return _built.get("module")


def lean_parts(dtype: torch.dtype) -> bool:
    """Do bfloat16 Llama layers on the lean path (models/lean.py) rotate q and k and scale their norms on
    the kernel (lean_kernel.cpp: same bits, fewer calls)?"""
    return dtype == torch.bfloat16 and kernel() is not None


def status() -> str:
    """'on', or 'off (<why>)', and whether linears stay on oneDNN: part of the device signature
    (models/dtypes.py), so cached probes and timings never mix the two."""
    if kernel() is None:
        return str(_built.get("why", "off"))
    return "on" if enabled(LINEAR_ENV) else f"on, linears off ({LINEAR_ENV}=0)"


def _build() -> tuple[Any | None, str]:
    try:
        import ninja  # the extension builder runs the `ninja` executable this package ships
        from torch.utils import cpp_extension
    except ImportError as err:
        return None, f"missing {err.name}"
    sources = [SOURCE, PREFILL_SOURCE, LINEAR_SOURCE, SCORES_SOURCE, LEAN_SOURCE, TOPK_SOURCE, UNIFORM_SOURCE,
               GUMBEL_SOURCE]
    tag = hashlib.sha256(b"\0".join([*(s.read_bytes() for s in [*sources, *HEADERS]), " ".join(FLAGS).encode(), _cpu().encode(),
                                     torch.__version__.encode()])).hexdigest()[:16]
    folder = cache_root() / "kernels" / f"exact-{tag}"
    path = os.environ.get("PATH", "")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + path
        module = cpp_extension.load(name=f"lookahead_exact_{tag}", sources=[str(s) for s in sources], extra_cflags=list(FLAGS),
                                    extra_ldflags=["-fopenmp"], build_directory=str(folder), verbose=False)
    except Exception as err:  # a missing compiler, a failed build or load: run without the kernel
        last = str(err).strip().splitlines()[-1][:200] if str(err).strip() else ""
        return None, f"build failed: {type(err).__name__}: {last}"
    finally:
        os.environ["PATH"] = path
    return module, "on"


def _cpu() -> str:
    """The CPU model and its feature flags (what -march=native compiles for)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return "|".join(next((ln for ln in lines if ln.startswith(key)), "") for key in ("model name", "flags"))
    except OSError:
        return platform.processor() or platform.machine()
