"""Which weights dtype to run: `auto` picks the fastest one this device runs well, by measurement.

A device qualifies for bfloat16 when it has bf16 kernels (x86 CPUs with avx512_bf16 or amx_bf16; CUDA
GPUs that report bf16 support); then both dtypes are timed on the model as load() will run them (linear
weights packed where that costs no exactness, models/packing.py; a decode-sized forward over a short cached
context, median of several) and bfloat16 is chosen only if it is clearly faster. The verdict is cached
per (model, device, packing) in <cache>/dtype-choices.json, so the timing runs once.
`--dtype NAME` still overrides; a dtype this device cannot run well is refused with the choices.
"""

from __future__ import annotations

import copy
import functools
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from lookahead.cachefile import read_json, update_json
from lookahead.engine import exact_kernel
from lookahead.errors import ConfigError
from lookahead.models.lean import enabled as lean_enabled
from lookahead.models.packing import PACKING_VERSION, pack_linears
from lookahead.models.registry import cache_root

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
CHOICES = ("auto", *DTYPES)
BF16_MARGIN = 0.9  # bfloat16 must take at most this share of float32's time to be chosen
# Each dtype is timed this many times, alternately. Once float32 packed too (SmolLM2 here: 43-48 ms against
# bf16's 33-40 for the timed pass), one timing each, right after a fresh machine converted the model,
# once read bf16 51.3 ms against float32 46.9 and picked float32.
TIMING_ROUNDS = 2


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags") or line.startswith("Features"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@functools.lru_cache(maxsize=1)
def device_signature() -> str:
    """Identifies the machine's kernels for the dtype cache: CPU model, torch version, threads, whether
    exact passes run on lookahead's own attention kernel (engine/exact_kernel.py; other numerics) and
    whether Llama layers run lean (models/lean.py; other timings)."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    lean = "on" if lean_enabled() else "off"  # the lean forward changes speed (not bits): timings are its own
    return (f"{model}|torch {torch.__version__}|threads {torch.get_num_threads()}|exact kernel {exact_kernel.status()}"
            f"|lean forward {lean}")


def supported(device: str = "cpu") -> tuple[str, ...]:
    """The dtypes this device runs with real kernels (auto first)."""
    flags = cpu_flags()
    out = ["auto", "float32", "float64"]
    if device.startswith("cuda"):
        out.append("float16")
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            out.append("bfloat16")
        return tuple(out)
    if flags & {"avx512_bf16", "amx_bf16"} or platform.machine() in ("arm64", "aarch64") and "bf16" in flags:
        out.append("bfloat16")
    if flags & {"avx512_fp16", "amx_fp16"} or platform.machine() in ("arm64", "aarch64") and "fphp" in flags:
        out.append("float16")
    return tuple(out)


def parse(dtype: str | torch.dtype, device: str = "cpu") -> torch.dtype | None:
    """A torch dtype, or None for "auto". Strings are checked against what this device supports."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in CHOICES:
        raise ConfigError(f"unknown dtype {dtype!r}; choose one of {', '.join(supported(device))}")
    if dtype not in supported(device):
        raise ConfigError(f"dtype {dtype} is not supported on this device ({device}: no {dtype} kernels); "
                          f"choose one of {', '.join(supported(device))}")
    return None if dtype == "auto" else DTYPES[dtype]


def choose(model: Any, key: str, device: str = "cpu", pack: bool = True) -> torch.dtype:
    """The dtype `auto` resolves to for `model` (loaded in float32), measured once and cached under `key`.
    `pack`: time each dtype as load() will run it, with its linear weights packed where that costs no
    exactness (models/packing.py; both dtypes pack here)."""
    if "bfloat16" not in supported(device):
        return torch.float32
    cache_file = cache_root() / "dtype-choices.json"
    entry = f"{key}|{device_signature()}" + (f"|packed{PACKING_VERSION}" if pack else "") + f"|rounds{TIMING_ROUNDS}"
    known = read_json(cache_file).get(entry)
    if isinstance(known, dict) and known.get("dtype") in DTYPES:
        return DTYPES[known["dtype"]]
    t32 = t16 = float("inf")
    for _ in range(TIMING_ROUNDS):  # alternating, best of each: a moment's load slows one timing, not the verdict
        t32 = min(t32, _step_time(_as_run(model, torch.float32, pack)))
        t16 = min(t16, _step_time(_as_run(model, torch.bfloat16, pack)))
    chosen = "bfloat16" if t16 <= BF16_MARGIN * t32 else "float32"
    measured = {"dtype": chosen, "float32_ms": round(t32 * 1e3, 2), "bfloat16_ms": round(t16 * 1e3, 2)}
    update_json(cache_file, entry, measured)
    return DTYPES[chosen]


def _as_run(model: Any, dtype: torch.dtype, pack: bool) -> Any:
    """`model` as load() would run it in `dtype`: itself where nothing changes, else a converted copy."""
    if not pack and next(model.parameters()).dtype == dtype:
        return model
    run = copy.deepcopy(model).to(dtype)
    if pack:
        pack_linears(run)
    return run


def _step_time(model: Any, context: int = 128, width: int = 4, repeats: int = 7) -> float:
    """Median seconds of a decode-sized forward (`width` rows over `context` cached tokens)."""
    from lookahead.engine.kvcache import KVCache
    from lookahead.engine.model_runner import ModelRunner

    vocab = model.get_output_embeddings().weight.shape[0]
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, min(vocab, 32_000), (context + width,), generator=gen)
    runner, cache = ModelRunner(model), KVCache()
    runner.prefill(cache, tokens[:context].tolist())
    local = torch.ones(width, width, dtype=torch.bool).tril_()
    times = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        runner.forward(cache, tokens[context:], torch.arange(context, context + width), local, torch.arange(width))
        cache.crop(-width)
        if i:  # the first is a warm-up
            times.append(time.perf_counter() - t0)
    return statistics.median(times)
