"""Issue-2 benchmark: six prompts, SmolLM2-135M-Instruct, float32, greedy, chat template, stop at end of turn.

Strategies run interleaved per prompt (A B C A B C ...), so machine drift hits all of them alike;
each figure is the median over --repeats. Speedups are ratios against our own autoregressive path,
measured on the whole generate call (prefill included, as the peers were) and on decode alone.
Prints a table and ends with one JSON line.

    python benchmarks/bench_prompts.py [--repeats 3] [--max-new-tokens 256] [--configs 4,4,4;2,3,4]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import torch

import lookahead
from lookahead import LookaheadConfig

PROMPTS = {
    "a": "Write a Python function that checks whether a number is prime, with a docstring and three doctests.",
    "b": "Write a Python class Stack with push, pop, peek, is_empty and __len__, fully type-annotated.",
    "c": "Convert this to JSON with keys name, age, city, email for each person: Alice Smith, 34, Paris, "
         "alice@example.com; Bob Jones, 28, Berlin, bob@example.com; Carol White, 45, Madrid, carol@example.com; "
         "Dan Brown, 39, Rome, dan@example.com.",
    "d": "Explain what a hash table is to a beginner in two short paragraphs.",
    "e": "Write a short poem about the sea at night.",
    "f": "List the numbers from 1 to 40, one per line, each followed by its square.",
}


def hf_run(lm: lookahead.LoadedModel, ids: list[int], max_new: int, pld: int) -> dict:
    x = torch.tensor([ids])
    kwargs = dict(do_sample=False, max_new_tokens=max_new, eos_token_id=list(lm.eos_token_ids),
                  pad_token_id=lm.eos_token_ids[0], attention_mask=torch.ones_like(x))
    if pld:
        kwargs["prompt_lookup_num_tokens"] = pld
    t = time.perf_counter()
    with torch.no_grad():
        out = lm.model.generate(x, **kwargs)
    total = time.perf_counter() - t
    return {"total_s": total, "decode_s": float("nan"), "token_ids": out[0, len(ids):].tolist(), "tps": float("nan")}


def ours(lm: lookahead.LoadedModel, ids: list[int], max_new: int, strategy: str, cfg: LookaheadConfig | None) -> dict:
    r = lookahead.generate(lm, ids, max_new_tokens=max_new, strategy=strategy, lookahead=cfg)
    s = r.stats
    return {"total_s": s.total_s, "decode_s": s.decode_s, "token_ids": r.token_ids, "tps": s.tokens_per_step,
            "q": s.processed_tokens / max(s.steps, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--prompts", default="abcdef")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--configs", default="", help="extra lookahead configs 'W,N,G;W,N,G' (default: the defaults)")
    ap.add_argument("--no-peers", action="store_true", help="skip transformers generate() and prompt lookup")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lm = lookahead.load(args.model)
    cfgs = {"lookahead": LookaheadConfig()}
    for spec in filter(None, args.configs.split(";")):
        w, n, g = (int(v) for v in spec.split(","))
        cfgs[f"la W{w}N{n}G{g}"] = LookaheadConfig(w, n, g)
    runs: dict[str, callable] = {"autoregressive": lambda ids: ours(lm, ids, args.max_new_tokens, "autoregressive", None)}
    for name, cfg in cfgs.items():
        runs[name] = lambda ids, cfg=cfg: ours(lm, ids, args.max_new_tokens, "lookahead", cfg)
    if not args.no_peers:
        runs["hf_generate"] = lambda ids: hf_run(lm, ids, args.max_new_tokens, 0)
        runs["hf_prompt_lookup"] = lambda ids: hf_run(lm, ids, args.max_new_tokens, 3)

    results: dict[str, dict[str, list[dict]]] = {p: {k: [] for k in runs} for p in args.prompts}
    ids_of = {p: lm.encode(PROMPTS[p]) for p in args.prompts}
    ours(lm, ids_of[args.prompts[0]], 8, "lookahead", LookaheadConfig())  # warm-up
    for rep in range(args.repeats):
        for p in args.prompts:
            for name, fn in runs.items():
                row = fn(ids_of[p])
                results[p][name].append(row)
                # one line per run as it finishes, so an interrupted benchmark still has its data
                print(json.dumps({"repeat": rep, "prompt": p, "strategy": name, "total_s": row["total_s"],
                                  "decode_s": row["decode_s"], "tokens": len(row["token_ids"]),
                                  "tokens_per_step": row["tps"], "query_per_step": row.get("q"),
                                  "identical": row["token_ids"] == results[p]["autoregressive"][0]["token_ids"]}),
                      file=sys.stderr, flush=True)
            print(f"repeat {rep + 1}/{args.repeats} prompt {p} done", file=sys.stderr, flush=True)

    table: dict[str, dict[str, dict]] = {}
    print(f"\n{'prompt':<7}{'strategy':<18}{'tokens':>7}{'tok/step':>9}{'q/step':>7}{'total s':>9}"
          f"{'speedup':>9}{'decode x':>9}{'identical':>10}")
    for p in args.prompts:
        base = results[p]["autoregressive"]
        base_total = statistics.median(r["total_s"] for r in base)
        base_decode = statistics.median(r["decode_s"] for r in base)
        table[p] = {}
        for name in runs:
            rows = results[p][name]
            total = statistics.median(r["total_s"] for r in rows)
            decode = statistics.median(r["decode_s"] for r in rows)
            ident = all(r["token_ids"] == base[0]["token_ids"] for r in rows)
            entry = {"tokens": len(rows[0]["token_ids"]), "tokens_per_step": rows[0]["tps"],
                     "query_per_step": rows[0].get("q", float("nan")), "total_s": total,
                     "speedup": base_total / total, "decode_speedup": base_decode / decode if decode == decode else None,
                     "identical": ident}
            table[p][name] = entry
            print(f"{p:<7}{name:<18}{entry['tokens']:>7}{entry['tokens_per_step']:>9.2f}{entry['query_per_step']:>7.1f}"
                  f"{total:>9.2f}{entry['speedup']:>9.2f}{(entry['decode_speedup'] or float('nan')):>9.2f}{str(ident):>10}")
    geo = {name: math.exp(statistics.fmean(math.log(table[p][name]["speedup"]) for p in args.prompts)) for name in runs}
    print("\ngeomean speedup (whole call): " + ", ".join(f"{k} {v:.2f}" for k, v in geo.items()))
    print(json.dumps({"model": args.model, "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
                      "threads": args.threads, "defaults": LookaheadConfig().__dict__, "geomean": geo, "table": table}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
