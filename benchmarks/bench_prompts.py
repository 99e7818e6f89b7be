"""Prompt benchmark: six prompts (lookahead.bench.prompts, a-f), SmolLM2-135M-Instruct, greedy, chat
template, stop at end of turn, in each dtype of --dtypes (default bfloat16 and float32), one model per
dtype loaded side by side.

Per prompt, every (dtype, strategy) runs interleaved (A B C A B C ...), so machine drift hits all of
them alike; each figure is the median over --repeats.

Strategies per dtype:
  autoregressive           the engine, passes padded to the width floor: the identity reference
  autoregressive/unpadded  the engine's plain width-1 steps (only where a floor exists)
  hf_generate              transformers' own generate()
  lookahead, prompt_lookup the engine's speculative strategies (exact: padded like the reference)
  lookahead/key-views      with --key-views: lookahead whose exact steps may also verify a second
                           chain over key views (key_views=True; off by default)
  lookahead/chain          with --chain-only: lookahead whose exact steps verify each tree's first
                           chain only (aligned_trees=False; the default verifies whole trees at
                           aligned key offsets where the probe allows)
  .../own-forward          with --own-forward: autoregressive, hf_generate's peer paths and the
                           speculative strategies through the model's own transformers forward instead
                           of lookahead's lean one (models/lean.py; LOOKAHEAD_LEAN_FORWARD=0); same bits
  .../plain-weights        with --plain-weights: autoregressive, hf_generate and lookahead on a second
                           copy of the model loaded with pack=False (PyTorch's own linear kernels;
                           in float32 other last bits than the packed default, models/packing.py)

Speedups divide the FASTEST autoregressive path's time per generated token (the best of
autoregressive, autoregressive/unpadded, hf_generate and, with --plain-weights, their plain-weights runs,
for that prompt and dtype; whole call, prefill included) by the strategy's: the exact path counts too,
since its passes run at the cheapest width (scheduler.py), which on the 2-core Zen 4 beats one row.
Identity is against the padded autoregressive path of the same dtype. Prints a table and ends with one
JSON line.

What requests learn (the calibrator's acceptance estimates, the recycled successors; engine/shared.py)
is kept per strategy and repeat and carried from prompt to prompt in order a-f, as `lookahead bench`
carries it from request to request of a class: prompt a starts cold, f from what a-e taught, and no
run ever starts from its own prompt's earlier answer.

    python benchmarks/bench_prompts.py [--repeats 3] [--max-new-tokens 256] [--dtypes bfloat16,float32] \
        [--variants "1,4,4,7"]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch

import lookahead
from lookahead import LookaheadConfig
from lookahead.bench.prompts import PROMPTS
from lookahead.candidates.recycling import SuccessorTable
from lookahead.engine.calibration import Calibrator
from lookahead.engine.numerics import width_probe
from lookahead.models import dtypes
from lookahead.models.lean import ENV as LEAN_ENV

AR, UNPADDED, HF = "autoregressive", "autoregressive/unpadded", "hf_generate"
PLAIN = "/plain-weights"
OWN = "/own-forward"


def hf_run(lm: lookahead.LoadedModel, ids: list[int], max_new: int) -> dict:
    x = torch.tensor([ids])
    t = time.perf_counter()
    with torch.no_grad():
        out = lm.model.generate(x, do_sample=False, max_new_tokens=max_new, eos_token_id=list(lm.eos_token_ids),
                                pad_token_id=lm.eos_token_ids[0], attention_mask=torch.ones_like(x))
    total = time.perf_counter() - t
    return {"total_s": total, "token_ids": out[0, len(ids):].tolist(), "tps": 1.0, "q": 1.0}


Learned = tuple[Calibrator, SuccessorTable]


def own_forward(fn: Callable[[], dict]) -> dict:
    """fn() with the model's own forward (each generate call builds its runners, which read the switch)."""
    os.environ[LEAN_ENV] = "0"
    try:
        return fn()
    finally:
        del os.environ[LEAN_ENV]


def ours(lm: lookahead.LoadedModel, ids: list[int], max_new: int, strategy: str, exact: bool = True,
         cfg: LookaheadConfig | None = None, key_views: bool = False, learned: Learned | None = None,
         aligned_trees: bool = True) -> dict:
    calibrator, successors = learned or (Calibrator(), SuccessorTable())
    r = lookahead.generate(lm, ids, max_new_tokens=max_new, strategy=strategy, lookahead=cfg or LookaheadConfig(),
                           exact=exact, key_views=key_views, calibrator=calibrator, successors=successors,
                           aligned_trees=aligned_trees, prefix_cache=False)  # every arm prefills whole, as
    # transformers' generate() does: a stored prompt would favour whichever arm ran it second
    s = r.stats
    return {"total_s": s.total_s, "token_ids": r.token_ids, "tps": s.tokens_per_step,
            "q": s.processed_tokens / max(s.steps, 1), "floor": r.width_floor,
            "overhead": s.overhead_s / s.decode_s if s.decode_s else 0.0, "by_source": s.accepted_by_source,
            "device_s": s.device_s}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--dtypes", default="",
                    help="comma-separated (default: bfloat16,float32 where the CPU has native bf16 kernels, else "
                         "float32; load refuses bf16 elsewhere)")
    ap.add_argument("--prompts", default="abcdef")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--strategies", default="lookahead,prompt_lookup", help="engine strategies besides the baselines")
    ap.add_argument("--variants", default="", metavar="W,N,G[,T];...",
                    help="extra lookahead shapes (T: context_tokens), each run as 'lookahead W=.. N=.. G=.. T=..'")
    ap.add_argument("--key-views", action="store_true",
                    help="also run lookahead verifying a second chain over key views, where the probe allows")
    ap.add_argument("--chain-only", action="store_true",
                    help="also run lookahead verifying each tree's first chain only (no aligned trees)")
    ap.add_argument("--own-forward", action="store_true",
                    help="also run autoregressive and --strategies through the model's own forward (not the lean one)")
    ap.add_argument("--plain-weights", action="store_true",
                    help="also run autoregressive, hf_generate and lookahead on the model loaded with pack=False")
    ap.add_argument("--source-sets", default="", metavar="a+b;...",
                    help="extra lookahead source sets (candidates/registry.py), each run as 'lookahead a+b'")
    args = ap.parse_args()
    variants = {}
    for spec in filter(None, args.source_sets.split(";")):
        variants[f"lookahead {spec}"] = LookaheadConfig(sources=tuple(spec.split("+")))
    for spec in filter(None, args.variants.split(";")):
        w, n_, g, *t = (int(v) for v in spec.split(","))
        cfg = LookaheadConfig(w, n_, g, context_tokens=t[0] if t else None)
        variants[f"lookahead W={w} N={n_} G={g}" + (f" T={t[0]}" if t else "")] = cfg
    torch.set_num_threads(args.threads)
    if not args.dtypes:
        args.dtypes = "bfloat16,float32" if "bfloat16" in dtypes.supported() else "float32"
    n = args.max_new_tokens

    runs: dict[tuple[str, str], Callable[[list[int], Learned], dict]] = {}
    models: dict[str, lookahead.LoadedModel] = {}
    for dtype in args.dtypes.split(","):
        lm = models[dtype] = lookahead.load(args.model, dtype=dtype)
        runs[(dtype, AR)] = lambda ids, learned, lm=lm: ours(lm, ids, n, "autoregressive", learned=learned)
        if width_probe(lm.model).floor is not None:
            runs[(dtype, UNPADDED)] = lambda ids, learned, lm=lm: ours(lm, ids, n, "autoregressive", exact=False,
                                                                      learned=learned)
        runs[(dtype, HF)] = lambda ids, learned, lm=lm: hf_run(lm, ids, n)
        for strategy in args.strategies.split(","):
            runs[(dtype, strategy)] = lambda ids, learned, lm=lm, s=strategy: ours(lm, ids, n, s, learned=learned)
        if args.key_views and width_probe(lm.model).tree_exact:
            runs[(dtype, "lookahead/key-views")] = lambda ids, learned, lm=lm: ours(lm, ids, n, "lookahead",
                                                                                  key_views=True, learned=learned)
        if args.chain_only and width_probe(lm.model).aligned_exact:
            runs[(dtype, "lookahead/chain")] = lambda ids, learned, lm=lm: ours(lm, ids, n, "lookahead",
                                                                              aligned_trees=False, learned=learned)
        if args.own_forward:
            for strategy in [AR] + args.strategies.split(","):
                runs[(dtype, strategy + OWN)] = lambda ids, learned, lm=lm, s=strategy: own_forward(
                    lambda: ours(lm, ids, n, s, learned=learned))
        if args.plain_weights:
            plain = lookahead.load(args.model, dtype=dtype, pack=False)
            runs[(dtype, AR + PLAIN)] = lambda ids, learned, lm=plain: ours(lm, ids, n, "autoregressive", learned=learned)
            runs[(dtype, HF + PLAIN)] = lambda ids, learned, lm=plain: hf_run(lm, ids, n)
            runs[(dtype, "lookahead" + PLAIN)] = lambda ids, learned, lm=plain: ours(lm, ids, n, "lookahead",
                                                                                   learned=learned)
        for label, cfg in variants.items():
            runs[(dtype, label)] = lambda ids, learned, lm=lm, c=cfg: ours(lm, ids, n, "lookahead", cfg=c,
                                                                          learned=learned)
    ids_of = {p: next(iter(models.values())).encode(PROMPTS[p]) for p in args.prompts}
    for lm in models.values():  # warm-up
        ours(lm, ids_of[args.prompts[0]], 8, "lookahead")

    results: dict[str, dict[tuple[str, str], list[dict]]] = {p: {k: [] for k in runs} for p in args.prompts}
    for rep in range(args.repeats):
        learned: dict[tuple[str, str], Learned] = {key: (Calibrator(), SuccessorTable()) for key in runs}
        for p in args.prompts:
            for key, fn in runs.items():
                row = fn(ids_of[p], learned[key])
                results[p][key].append(row)
                ref = results[p][(key[0], AR)][0]["token_ids"]
                # one line per run as it finishes, so an interrupted benchmark still has its data
                print(json.dumps({"repeat": rep, "prompt": p, "dtype": key[0], "strategy": key[1],
                                  "total_s": row["total_s"], "tokens": len(row["token_ids"]),
                                  "tokens_per_step": row["tps"], "query_per_step": row["q"],
                                  "overhead": row.get("overhead"), "by_source": row.get("by_source"),
                                  "identical": row["token_ids"] == ref}), file=sys.stderr, flush=True)
            print(f"repeat {rep + 1}/{args.repeats} prompt {p} done", file=sys.stderr, flush=True)

    def ms_per_token(rows: list[dict]) -> float:
        return statistics.median(r["total_s"] / max(len(r["token_ids"]), 1) for r in rows) * 1000

    table: dict[str, dict[str, dict]] = {}
    print(f"\n{'prompt':<7}{'dtype':<10}{'strategy':<32}{'tokens':>7}{'tok/step':>9}{'q/step':>7}{'ms/tok':>8}"
          f"{'vs fastest AR':>14}{'identical':>10}{'overhead':>9}  accepted by source")
    for p in args.prompts:
        table[p] = {}
        for dtype in models:
            fastest = min(ms_per_token(results[p][(dtype, s)]) for s in (AR, UNPADDED, HF, AR + PLAIN, HF + PLAIN,
                                                                                   AR + OWN)
                          if (dtype, s) in runs)
            base = results[p][(dtype, AR)][0]["token_ids"]
            for (d, name), rows in results[p].items():
                if d != dtype:
                    continue
                ms = ms_per_token(rows)
                entry = {"tokens": len(rows[0]["token_ids"]), "tokens_per_step": rows[0]["tps"],
                         "query_per_step": rows[0]["q"], "ms_per_token": ms, "speedup": fastest / ms,
                         "identical": all(r["token_ids"] == base for r in rows),
                         "overhead": statistics.median(r.get("overhead", 0.0) for r in rows),
                         "by_source": rows[0].get("by_source", {})}
                table[p][f"{dtype} {name}"] = entry
                spent = {k: v for k, v in entry["by_source"].items() if k != "model"}
                print(f"{p:<7}{dtype:<10}{name:<32}{entry['tokens']:>7}{entry['tokens_per_step']:>9.2f}"
                      f"{entry['query_per_step']:>7.1f}{ms:>8.1f}{entry['speedup']:>14.2f}{str(entry['identical']):>10}"
                      f"{entry['overhead']:>9.1%}  {spent}")
    keys = list(table[args.prompts[0]])
    geo = {k: math.exp(statistics.fmean(math.log(table[p][k]["speedup"]) for p in args.prompts)) for k in keys}
    ident = {k: sum(table[p][k]["identical"] for p in args.prompts) for k in keys}
    ar_ratio = {}
    if {"bfloat16", "float32"} <= set(models):  # bf16 vs float32 autoregressive tokens/s, fastest paths
        ar_ratio = {p: min(table[p][f"float32 {s}"]["ms_per_token"] for s in (AR, UNPADDED, HF) if f"float32 {s}" in table[p]) /
                    min(table[p][f"bfloat16 {s}"]["ms_per_token"] for s in (AR, UNPADDED, HF) if f"bfloat16 {s}" in table[p])
                    for p in args.prompts}
    print("\ngeomean speedup over the fastest autoregressive path of the same dtype:")
    for k in keys:
        print(f"  {k:<42}{geo[k]:.2f}x   identical {ident[k]}/{len(args.prompts)}")
    # Paired: lookahead's time per token against prompt lookup's, prompt by prompt, same dtype and run.
    vs_pl = {}
    for dtype in models:
        if f"{dtype} prompt_lookup" in keys and f"{dtype} lookahead" in keys:
            r = [table[p][f"{dtype} prompt_lookup"]["ms_per_token"] / table[p][f"{dtype} lookahead"]["ms_per_token"]
                 for p in args.prompts]
            vs_pl[dtype] = math.exp(statistics.fmean(math.log(v) for v in r))
            print(f"{dtype}: lookahead vs prompt_lookup, geomean of paired ratios {vs_pl[dtype]:.2f}x")
    if ar_ratio:
        g = math.exp(statistics.fmean(math.log(v) for v in ar_ratio.values()))
        print(f"bfloat16 vs float32 autoregressive tokens/s (fastest paths): geomean {g:.2f}x")
    floors = {d: width_probe(m.model).floor for d, m in models.items()}
    print(json.dumps({"model": args.model, "max_new_tokens": n, "repeats": args.repeats, "threads": args.threads,
                      "width_floor": floors, "packed_linears": {d: m.packed for d, m in models.items()}, "defaults": LookaheadConfig().__dict__, "geomean": geo,
                      "identical": ident, "vs_prompt_lookup": vs_pl, "bf16_vs_fp32_ar": ar_ratio, "table": table}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
