"""Serving-path profile: forward time t(k) for k query tokens on top of a context of L cached tokens.

If t(k) stays flat as k grows, the path is bandwidth-bound and verifying guesses is nearly free; the
free verification budget is the largest k with t(k) <= 1.1 * t(1). The W, N, G that fit it are those
with 1 + (W + G) * (N - 1) query tokens per lookahead step within the budget (candidates of N-1
tokens, i.e. context_tokens=None).
"""

from __future__ import annotations

import inspect
import statistics
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch

DEFAULT_KS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 112, 128)
DEFAULT_CONTEXTS = (256, 1024, 4096)
BUDGET_TOLERANCE = 1.1
NGRAM_PREFERENCE = (4, 3, 5, 2, 6)


def _new_cache(model: Any) -> Any:
    """The engine's in-place KV cache when available (the serving path), else transformers' own."""
    try:
        from lookahead.engine.kvcache import KVCache

        return KVCache()
    except ImportError:  # pragma: no cover - engine layout changed
        from transformers import DynamicCache

        return DynamicCache(config=model.config)


def _forward(model: Any, ids: torch.Tensor, cache: Any, start: int) -> None:
    params = inspect.signature(model.forward).parameters
    kwargs: dict[str, Any] = {"cache" if "cache" in params else "past_key_values": cache, "use_cache": True}
    if "logits_to_keep" in params:
        kwargs["logits_to_keep"] = ids.shape[1]  # verification reads every row's logits
    pos = torch.arange(start, start + ids.shape[1])[None]
    model(input_ids=ids, position_ids=pos, **kwargs)


def time_context(model: Any, vocab: int, context: int, ks: Sequence[int], repeats: int, seed: int) -> dict[int, float]:
    """Median seconds of one forward of k tokens over a cached context of `context` tokens, per k."""
    gen = torch.Generator().manual_seed(seed + context)
    cache = _new_cache(model)
    times: dict[int, list[float]] = defaultdict(list)
    with torch.inference_mode():
        _forward(model, torch.randint(0, vocab, (1, context), generator=gen), cache, 0)
        for k in (1, max(ks)):  # warm-up, then drop what it appended
            _forward(model, torch.randint(0, vocab, (1, k), generator=gen), cache, context)
            cache.crop(-k)
        for _ in range(repeats):
            for k in ks:  # one pass over all k per repeat, so drift spreads evenly
                q = torch.randint(0, vocab, (1, k), generator=gen)
                t0 = time.perf_counter()
                _forward(model, q, cache, context)
                times[k].append(time.perf_counter() - t0)
                cache.crop(-k)
                if cache.get_seq_length() != context:
                    raise RuntimeError(f"cache holds {cache.get_seq_length()} tokens after crop, expected {context}")
    return {k: float(statistics.median(v)) for k, v in sorted(times.items())}


def budget(times: dict[int, float], tolerance: float = BUDGET_TOLERANCE) -> int:
    """Largest measured k with t(k) <= tolerance * t(1)."""
    t1 = times[min(times)]
    return max(k for k, t in times.items() if t <= tolerance * t1)


def fitting_configs(free: int) -> list[dict[str, int]]:
    """For each N, the largest symmetric W = G with 1 + (W + G)(N - 1) <= free, if any."""
    out = []
    for n in sorted(NGRAM_PREFERENCE):
        wg = (free - 1) // (2 * (n - 1))
        if wg >= 1:
            out.append({"window": wg, "ngram": n, "guesses": wg, "query_tokens": 1 + 2 * wg * (n - 1)})
    return out


def recommend(configs: list[dict[str, int]]) -> dict[str, int] | None:
    by_n = {c["ngram"]: c for c in configs}
    for n in NGRAM_PREFERENCE:
        if n in by_n:
            return by_n[n]
    return None


def run_profile(loaded: Any, *, contexts: Sequence[int], ks: Sequence[int] = DEFAULT_KS, repeats: int = 3,
                seed: int = 0, log: Any = None) -> dict[str, Any]:
    """Profile every context that fits the model; returns the profile document (profile.json)."""
    model = loaded.model
    vocab = int(model.get_input_embeddings().weight.shape[0])
    ks = sorted(set(ks) | {1})
    out: dict[str, Any] = {"device": _device_name(model), "threads": torch.get_num_threads(),
                           "tolerance": BUDGET_TOLERANCE, "ks": ks, "repeats": repeats, "contexts": [], "skipped": []}
    for ctx in contexts:
        if ctx + max(ks) > loaded.context_length:
            out["skipped"].append({"context": ctx, "reason": f"context + {max(ks)} exceeds the model's "
                                   f"{loaded.context_length} tokens"})
            continue
        if log:
            log(f"profiling context {ctx} ...")
        times = time_context(model, vocab, ctx, ks, repeats, seed)
        free = budget(times)
        configs = fitting_configs(free)
        out["contexts"].append({
            "context": ctx,
            "t_s": {str(k): t for k, t in times.items()},
            "t1_s": times[1],
            "free_budget_tokens": free,
            "bandwidth_bound": free > 1,
            "fitting_configs": configs,
            "recommended": recommend(configs),
        })
    return out


def _device_name(model: Any) -> str:
    dev = next(model.parameters()).device
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return f"{dev.type} ({torch.get_num_threads()} threads)"


def prefill_decode_share(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Share of wall time in prefill vs decode, per class and strategy, from results rows."""
    acc: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for r in rows:
        a = acc[(r["class"], r["strategy"])]
        a[0] += float(r["prefill_s"])
        a[1] += float(r["decode_s"])
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for (cls, strat), (p, d) in sorted(acc.items()):
        out[cls][strat] = p / (p + d) if p + d > 0 else 0.0
    return dict(out)


def table(doc: dict[str, Any]) -> str:
    lines = [f"{'context':>8} {'t(1) ms':>9} {'t(8) ms':>9} {'t(32) ms':>9} {'t(128) ms':>10} {'budget k':>9}  W,N,G"]
    for c in doc["contexts"]:
        t = c["t_s"]

        def ms(k: int) -> str:
            return f"{t[str(k)] * 1000:.1f}" if str(k) in t else "-"

        rec = c["recommended"]
        wng = f"{rec['window']},{rec['ngram']},{rec['guesses']}" if rec else "none fit (compute-bound)"
        lines.append(f"{c['context']:>8} {ms(1):>9} {ms(8):>9} {ms(32):>9} {ms(128):>10} {c['free_budget_tokens']:>9}  {wng}")
    for s in doc["skipped"]:
        lines.append(f"{s['context']:>8} skipped: {s['reason']}")
    num = doc.get("numerics")
    if num:
        floor = f"{num['floor']} rows (every pass is padded to it: bit-identical rows above it)" if num["floor"] \
            else "none (passes run unpadded; float rounding may differ between widths)"
        differ = [w for w, d in num["diffs"].items() if d]
        lines.append(f"dtype {doc.get('dtype', num['dtype'])}; width floor: {floor}; probed widths 1..{num['max_width']}, "
                     f"differing: {', '.join(differ) or 'none'}; exact attention: {num['exact_attention']}; "
                     f"tree branches exact over key views: {num.get('tree_exact', False)} "
                     f"(without views, gap-invariant: {num['gap_invariant']})")
    return "\n".join(lines)
