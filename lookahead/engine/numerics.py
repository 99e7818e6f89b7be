"""The width-invariance probe: from how many query rows on does a row's output stop depending on the
width of the forward pass?

At reduced precision (bfloat16 on CPUs with avx512_bf16, measured on SmolLM2 and Gemma 3) a row's logits
are bit-identical for every width >= 4 and differ below it (>= 2 with packed weights). In float32 on the
same CPU every width used to differ in the last bits; with packed weights (models/packing.py) and the
exact attention's fixed-size key chunks (engine/attention.py) every width >= 2 agrees, and with MKL's
plain linears every width >= 4. The engine pads every pass up to the floor (engine/model_runner.py), so
an autoregressive step and a lookahead step compute the same rows the same way, and lookahead's tokens
are exactly autoregressive decoding's, not just up to float rounding.

Kernels may also change path above some width: on a Xeon with AMX (bfloat16, 2 threads) oneDNN's linears
gave other rows from 33 rows on than at 1-32, so no floor reached the widest pass. So the probe also finds
a ceiling, the widest pass that agrees with the floor, and the engine never runs an exact pass wider
(engine/model_runner.py; the allocator sizes steps within it, scheduler/scheduler.py).

And a kernel may compute the rows past its last full block of rows otherwise: on Zen 4, MKL's float64
matmuls gave a pass's last w % 4 rows other last bits than the same rows in a pass of a multiple of 4. So
the probe also finds a quantum, and the engine runs every exact pass at a multiple of it.

The probe prefills a random context, then runs a contiguous chain of w tokens for each probed width w
(every w up to 16, then a spread up to `max_width`), reading every row's logits, and compares every row
with the same row of a wider pass. The floor is the smallest w from which every probed width up to the
ceiling agrees bit for bit; the ceiling is the widest width with the lowest floor (at least MIN_CEILING).
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lookahead.cachefile import read_json, update_json
from lookahead.engine import tree_checks
from lookahead.engine.attention import install
from lookahead.engine.kvcache import KVCache
from lookahead.engine.model_runner import ModelRunner, Rows
from lookahead.engine.value_sums import KEY_ALIGN, KEY_CHUNK, model_key_chunk
from lookahead.errors import ConfigError

# Bump when the engine's numerics change (cached probes of older versions are ignored). 15: exact bfloat16
# passes on the C++ kernel (engine/exact_kernel.py); 16: floor 2 at least with a plain linear layer;
# 17: aligned trees on the kernel without the pair rule; 18: the kernel's own softmax, trees gap-free on it
# (engine/attention.py key_layout); 19: its bfloat16 scores over dimension pairs (scores_kernel.cpp).
PROBE_VERSION = 19
USABLE_FLOOR = 16  # a floor above this would make every step as wide as 16 rows: treated as none
MIN_CEILING = 16  # a ceiling below this (or below max_width, if less) leaves steps too narrow: not taken
_CONTEXTS = (40, 300, 700, 1000)  # cached context lengths the rows are probed over (passes that straddle
# 1024 keys, where a matmul over more keys used to reduce them otherwise; engine/value_sums.py KEY_CHUNK)
_MIN_CONTEXT = 8


@dataclass(frozen=True)
class WidthProbe:
    """floor: the width from which rows are bit-identical (None: no usable floor, e.g. unpacked float32 here);
    max_width: the widest pass probed; ceiling: the widest pass whose rows agree with the floor's (no exact
    pass may be wider; None: max_width); diffs: width -> max |logit difference| of rows 0-1 against the
    ceiling's pass."""

    floor: int | None
    max_width: int
    diffs: dict[int, float]
    dtype: str
    gap_invariant: bool = False  # rows are unchanged by masked keys between their visible keys
    exact_attention: bool = False  # measured with (and the engine then runs) engine/attention.py
    # a sequence needs no padding of its own in a pass whose sequences carry >= floor rows together: its
    # rows come out as they do alone at the floor (continuous batching, engine/model_runner.py)
    batch_exact: bool = False
    # a tree branch's rows, computed over their keys gathered into position order (engine/attention.py
    # KeyView), come out as the same tokens do as the first chain: exact steps may verify whole trees
    tree_exact: bool = False
    # a tree's nodes, their keys at aligned offsets (engine/query.py align_tree), come out as the same
    # tokens do as the first chain: exact steps verify whole trees at no cost but masked keys
    aligned_exact: bool = False
    ceiling: int | None = None
    # passes run at a multiple of this many rows: rows past the last full block of `quantum` rows came out
    # otherwise (MKL's float64 matmuls on Zen 4 compute a pass's last w % 4 rows with other kernels)
    quantum: int = 1
    # the exact attention summed values over keys in chunks of this many (engine/value_sums.py key_chunk):
    # the verdict holds for that chunk only
    key_chunk: int = KEY_CHUNK

    @property
    def widest_exact(self) -> int:
        """The most query rows one exact pass may carry (all sequences of a batched pass together)."""
        return self.ceiling if self.ceiling is not None else self.max_width

    def to_dict(self) -> dict[str, object]:
        return {"floor": self.floor, "max_width": self.max_width, "ceiling": self.ceiling, "dtype": self.dtype,
                "exact_attention": self.exact_attention, "batch_exact": self.batch_exact,
                "tree_exact": self.tree_exact, "aligned_exact": self.aligned_exact,
                "gap_invariant": self.gap_invariant, "quantum": self.quantum, "key_chunk": self.key_chunk,
                "diffs": {str(k): v for k, v in sorted(self.diffs.items())}}


def probed_widths(max_width: int, dense: bool = True) -> list[int]:
    """Every width up to 16 (`dense`; else a few), then widths around powers of two, up to max_width."""
    low = set(range(1, 17)) if dense else {1, 2, 3, 4, 5, 8, 16}
    spread = {17, 24, 31, 32, 33, 48, 63, 64, 65, 96, 127, 128, 129, 192, 255, 256, 257, 384, 511, 512}
    return sorted({w for w in low | spread if w <= max_width} | {max_width})


def probe_width_floor(model: Any, max_width: int = 64, seed: int = 0) -> WidthProbe:
    """Measure the floor of `model` (any causal LM the engine runs) up to `max_width` rows, over cached
    contexts of several lengths (kernels change blocking with the number of keys too)."""
    if max_width < 2:
        raise ValueError("max_width must be >= 2")
    vocab = model.get_output_embeddings().weight.shape[0]
    limit = _context_limit(model) - max_width - 4
    if limit < _MIN_CONTEXT:
        raise ConfigError(
            f"the model's context ({_context_limit(model)} tokens) is too short to probe steps of {max_width} rows; "
            "use a model with a longer context or smaller lookahead settings (fewer query tokens per step), "
            "or pass exact=False (--no-exact) to run unpadded"
        )
    contexts = [c for c in _CONTEXTS if c <= limit] or [limit]
    gen = torch.Generator().manual_seed(seed)
    hi = min(vocab, 32_000)
    tokens = torch.randint(0, hi, (contexts[-1] + max_width + 3,), generator=gen)
    exact = install(model)  # the width-invariant attention, where the model takes it
    runner = ModelRunner(model, floor=None, exact_attention=exact, views=exact)
    cache = KVCache(KEY_ALIGN)
    prints: list[dict[int, torch.Tensor]] = []  # per context: width -> [w] fingerprints of every row
    firsts: list[dict[int, torch.Tensor]] = []  # per context: width -> logits of rows 0-1 (for `diffs`)
    gap_invariant = tree_exact = aligned_exact = True
    for i, ctx in enumerate(contexts):
        runner.prefill(cache, tokens[cache.get_seq_length() : ctx].tolist())
        chain = tokens[ctx : ctx + max_width + 3]
        prints.append({})
        firsts.append({})
        for w in probed_widths(max_width, dense=i == 0):
            local = torch.ones(w, w, dtype=torch.bool).tril_()
            logits = runner.forward(cache, chain[:w], torch.arange(ctx, ctx + w), local, torch.arange(w))
            cache.crop(-w)
            prints[-1][w] = _fingerprints(logits)
            firsts[-1][w] = logits[: min(w, 2)].float()
        checked = min(16, max_width)  # the tree checks' pass width (engine/tree_checks.py)
        gap_invariant = gap_invariant and tree_checks.gap_invariant(runner, cache, chain, checked)
        tree_exact = tree_exact and exact and tree_checks.tree_exact(runner, cache, chain, checked)
        aligned_exact = (aligned_exact and exact and tree_checks.tree_exact(runner, cache, chain, checked, aligned=True)
                         and tree_checks.random_trees_exact(runner, cache, chain, min(MIN_CEILING, max_width), seed + i))
    floor, ceiling, quantum = row_rule(prints, min(MIN_CEILING, max_width))
    if floor == 1 and plain_linears(model):
        floor = 2  # a plain linear's single row runs another kernel than the same row among others (see below)
    aligned_exact = aligned_exact and not tree_checks.reduces_keys_in_small_blocks(model)
    diffs: dict[int, float] = {}
    for rows in firsts:
        ref = rows[ceiling if ceiling is not None else max_width]
        for w, r in rows.items():
            diffs[w] = max(diffs.get(w, 0.0), float((r - ref[: r.shape[0]]).abs().max()))
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    batch_exact = floor is not None and quantum == 1 and _batch_invariant(runner, tokens, floor, contexts)
    return WidthProbe(floor, max_width, diffs, dtype, gap_invariant and floor is not None, exact, batch_exact,
                      tree_exact and floor is not None, aligned_exact and floor is not None,
                      ceiling if ceiling != max_width else None, quantum, runner.key_chunk)


def plain_linears(model: Any) -> bool:
    """Does `model` have a linear layer on PyTorch's own kernel (not packed, models/packing.py)? Such a layer
    computes a pass of one row with a matrix-vector kernel that sums in another order than its matrix
    kernel, so a row alone may get other last bits than the same row beside others. The probe's random
    rows need not show it: the tiny Gemma 3 in bfloat16 probed as floor 1, and then a test prompt's
    o_proj gave a row other bits alone than in a pass of 3, and lookahead other tokens than autoregressive
    decoding (heavy-tailed inputs show it in 4 of 256 rows; normal ones in none). Packed layers compute a
    single row as the first of two. So a model with a plain linear layer is given floor 2 at least."""
    return any(type(m) is torch.nn.Linear for m in model.modules())


def _fingerprints(logits: torch.Tensor) -> torch.Tensor:
    """[R, V] logits -> [R] int64: each row's bits hashed (equal rows give equal prints; unequal ones
    collide with odds ~2^-64), so every row of every probed pass can be compared without keeping them."""
    bits = logits.contiguous().view(torch.int16 if logits.element_size() == 2 else
                                    torch.int32 if logits.element_size() == 4 else torch.int64).to(torch.int64)
    weights = torch.arange(1, bits.shape[-1] + 1, dtype=torch.int64).mul_(0x9E3779B97F4A7C15 - (1 << 64)).bitwise_or_(1)
    return (bits * weights).sum(-1)  # wraps around in int64: still a function of the bits alone


QUANTA = (1, 2, 4, 8)  # row multiples the probe tries (engine/model_runner.py pads passes to one)


def row_rule(prints: list[dict[int, torch.Tensor]], least: int) -> tuple[int | None, int | None, int]:
    """(floor, ceiling, quantum): of `floor_and_ceiling` under each quantum of QUANTA, the lowest floor, then
    the widest ceiling, then the smallest quantum. On Zen 4, MKL's float64 matmuls gave a pass's last
    w % 4 rows other last bits than the same rows in a pass of a multiple of 4: (16, 17) under quantum 1,
    (4, none) under 4. Returns (None, None, 1) where no quantum gives a usable floor."""
    found = [(*floor_and_ceiling(prints, least, q), q) for q in QUANTA]
    usable = [(f, c, q) for f, c, q in found if f is not None and c is not None]
    if not usable:
        return None, None, 1
    return min(usable, key=lambda r: (r[0], -r[1], r[2]))


def floor_and_ceiling(prints: list[dict[int, torch.Tensor]], least: int,
                      quantum: int = 1) -> tuple[int | None, int | None]:
    """From every row's fingerprint per probed width (per context), the lowest usable floor and, for it,
    the widest ceiling: every probed width in [floor, ceiling] gives each of its rows what the ceiling's
    pass gives that row, in every context, and at least two probed widths agree (floor < ceiling).
    Only widths that are multiples of `quantum` count (passes are padded to one). Ceilings below `least`
    are not taken. Returns (None, None) where no floor is usable."""
    widths = sorted(w for w in prints[0] if w % quantum == 0)
    best: tuple[int, int] | None = None
    for top in reversed(widths):
        if top < least:
            break
        floor = 1
        for per_width in prints:
            if top not in per_width:
                continue
            ref, low = per_width[top], top
            for w in sorted((w for w in per_width if w <= top and w % quantum == 0), reverse=True):
                if not torch.equal(per_width[w], ref[:w]):
                    break
                low = w
            floor = max(floor, low)
        # floor == top would compare a width only with itself: no agreement measured
        if floor < top and floor <= USABLE_FLOOR and (best is None or floor < best[0]):
            best = (floor, top)
    return best if best is not None else (None, None)


def _batch_invariant(runner: ModelRunner, tokens: torch.Tensor, floor: int, contexts: list[int]) -> bool:
    """Does a sequence of q < floor rows, in a pass of B sequences with B * q >= floor, get the logits it
    gets alone in a pass padded to the floor? Sequences over different context lengths, B up to 16."""
    for q in range(1, floor):
        for b in sorted({-(-floor // q), 4, 8, 16}):
            if b * q < floor:
                continue
            cache = KVCache(KEY_ALIGN, b)
            lengths = [contexts[i % len(contexts)] - i for i in range(b)]
            alone, parts = [], []
            for slot, n in enumerate(lengths):
                cache.select(slot, slot + 1)
                runner.prefill(cache, tokens[:n].tolist())
                rows = Rows(tokens[n : n + q], torch.arange(n, n + q), torch.ones(q, q, dtype=torch.bool).tril_(),
                            torch.arange(q))
                alone.append(runner.forward(cache, rows.tokens, rows.positions, rows.local, rows.keep, floor))
                cache.keep(n, torch.arange(0))
                parts.append(rows)
            cache.select(0, b)
            together = runner.forward_batch(cache, parts)
            if not all(torch.equal(a, t) for a, t in zip(alone, together)):
                return False
    return True


_probes: weakref.WeakKeyDictionary[Any, WidthProbe] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def width_probe(model: Any, min_width: int = 2, cache_file: Path | None = None, cache_key: str = "") -> WidthProbe:
    """The model's probe, covering at least `min_width` rows (64 where the context allows); measured once
    per model and widened when a wider step comes along (next power of two). With `cache_file`, results
    are kept on disk under `cache_key` (identify the model, its dtype and the device) and reused."""
    with _lock:
        probe = _probes.get(model)
        if probe is None and cache_file is not None:
            probe = _read(cache_file).get(cache_key)
            if probe is not None and probe.exact_attention and (not install(model) or
                                                                probe.key_chunk != model_key_chunk(model)):
                probe = None  # the cached verdict assumed an attention this model cannot take now
        if probe is None or probe.max_width < min_width:
            width = max(64, 1 << (max(min_width, 2) - 1).bit_length())
            width = max(2, min(width, max(min_width, _context_limit(model) - _MIN_CONTEXT - 4)))
            probe = probe_width_floor(model, width)
            if cache_file is not None:
                _write(cache_file, cache_key, probe)
        _probes[model] = probe
        return probe


def _read(path: Path) -> dict[str, WidthProbe]:
    try:
        return {k: WidthProbe(v["floor"], v["max_width"], {int(w): d for w, d in v["diffs"].items()}, v["dtype"],
                              v["gap_invariant"], v["exact_attention"], v.get("batch_exact", False),
                              v.get("tree_exact", False), v.get("aligned_exact", False), v.get("ceiling"),
                              v.get("quantum", 1), v.get("key_chunk", KEY_CHUNK))
                for k, v in read_json(path).items()}
    except (KeyError, TypeError, AttributeError, ValueError):
        return {}


def _write(path: Path, key: str, probe: WidthProbe) -> None:
    update_json(path, key, probe.to_dict())


def _context_limit(model: Any) -> int:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    for attr in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return 2048
