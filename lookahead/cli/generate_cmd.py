"""`lookahead generate`: decode one prompt, optionally comparing a strategy with autoregressive decoding."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from lookahead.models.packing import NO_PACK_HELP
from lookahead.candidates.ngram_cache import NGramCache
from lookahead.config import STRATEGIES, LookaheadConfig, PromptLookupConfig, SamplingConfig, SpeculativeConfig
from lookahead.generation import GenerationResult, generate, stream_events
from lookahead.engine.certify import Certificate, certify
from lookahead.errors import ConfigError, PromptError
from lookahead.learned import check_learned_file, load_learned, save_learned
from lookahead.models import DEFAULT_MODEL, load
from lookahead.models.dtypes import CHOICES as DTYPE_CHOICES
from lookahead.models.dtypes import parse as parse_dtype

_STAT_KEYS = ("prompt_tokens", "cached_tokens", "new_tokens", "steps", "tokens_per_step", "guesses_verified",
              "guesses_accepted", "prefill_s", "decode_s", "tokens_per_s", "device_s", "draft_steps", "draft_s",
              "accepted_by_source")


def register(sub: Any) -> None:
    p = sub.add_parser("generate", help="generate text for one prompt")
    p.add_argument("prompt", nargs="?", default=None, help="the prompt, or '-' to read stdin")
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"embedded name, HF folder or .gguf (default {DEFAULT_MODEL})")
    p.add_argument("--dtype", default="auto",
                   help=f"weights dtype: {', '.join(DTYPE_CHOICES)} (default auto: the fastest this device runs well, "
                        "measured once per model)")
    p.add_argument("--strategy", default="lookahead", choices=STRATEGIES)
    d = LookaheadConfig()
    p.add_argument("--window", "-W", type=int, default=d.window, help=f"lookahead window W (default {d.window})")
    p.add_argument("--ngram", "-N", type=int, default=d.ngram, help=f"n-gram size N (default {d.ngram})")
    p.add_argument("--guesses", "-G", type=int, default=d.guesses, help=f"verified n-grams per step G (default {d.guesses})")
    p.add_argument("--context-tokens", type=int, default=d.context_tokens, metavar="T",
                   help=f"lookahead: longest prompt/context or cached candidate, in tokens (default {d.context_tokens})")
    sp = SpeculativeConfig()
    p.add_argument("--draft", default=sp.draft, metavar="MODEL_OR_self:L",
                   help="speculative: a draft model sharing the tokenizer (name or path), or self:L for the target's "
                        f"first L layers (default {sp.draft}: half of them)")
    p.add_argument("--draft-tokens", "-k", type=int, default=sp.draft_tokens,
                   help=f"speculative: tokens drafted per step (default {sp.draft_tokens})")
    pl = PromptLookupConfig()
    p.add_argument("--lookup-min-ngram", type=int, default=pl.min_ngram, help=f"prompt_lookup: shortest suffix matched (default {pl.min_ngram})")
    p.add_argument("--lookup-max-ngram", type=int, default=pl.max_ngram, help=f"prompt_lookup: longest suffix matched (default {pl.max_ngram})")
    p.add_argument("--lookup-tokens", type=int, default=pl.num_tokens, help=f"prompt_lookup: tokens per candidate (default {pl.num_tokens})")
    p.add_argument("--lookup-candidates", type=int, default=pl.max_candidates,
                   help=f"prompt_lookup: matches verified per step (default {pl.max_candidates})")
    p.add_argument("--ngram-cache", type=Path, default=None, metavar="FILE",
                   help="cross-request n-gram cache for lookahead/prompt_lookup: read from FILE if it exists, "
                        "updated with this response and written back")
    p.add_argument("--learned", type=Path, default=None, metavar="FILE",
                   help="what earlier runs on this model learned (how often each source's guesses are accepted, the "
                        "model's recycled successors): read from FILE if it exists, updated by this run and written "
                        "back. Steps start as long as earlier runs taught; tokens are the same either way")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--raw", action="store_true", help="send the prompt as raw text, not as a user chat message")
    p.add_argument("--stream", action="store_true", help="print text as it is accepted")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--no-adaptive", dest="adaptive", action="store_false",
                   help="run every draft as proposed (default: skip speculative work not expected to pay on this device)")
    p.add_argument("--no-pack", dest="pack", action="store_false",
                   help=NO_PACK_HELP)
    p.add_argument("--no-exact", dest="exact", action="store_false",
                   help="run unpadded (fastest plain path; identical to other strategies only up to float rounding)")
    p.add_argument("--certify", action="store_true",
                   help="check the output against a higher-precision forward of the same model and report the "
                        "tokens that are not its choice")
    p.add_argument("--compare", action="store_true",
                   help="run autoregressive and --strategy (lookahead if that is autoregressive), report speedup and identity")
    p.set_defaults(func=run)


def _read_prompt(args: argparse.Namespace) -> str:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if prompt is None or not prompt.strip():
        raise PromptError("the prompt is empty; pass it as an argument or '-' to read stdin")
    return prompt


def _payload(r: GenerationResult, cert: Certificate | None) -> dict[str, Any]:
    stats = r.stats.to_dict()
    out = {"text": r.text, "token_ids": r.token_ids, "finish_reason": r.finish_reason, "strategy": r.strategy,
           "dtype": r.dtype, "width_floor": r.width_floor,
           "stats": {k: stats[k] for k in _STAT_KEYS} | {"processed_tokens": stats["processed_tokens"],
                                                         "acceptance_rate": stats["acceptance_rate"]}}
    if cert is not None:
        out["certificate"] = cert.to_dict()
    return out


def run(args: argparse.Namespace) -> int:
    # Validate everything cheap before loading the model.
    prompt = _read_prompt(args)
    la = LookaheadConfig(window=args.window, ngram=args.ngram, guesses=args.guesses,
                         context_tokens=args.context_tokens)
    sampling = SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    lookup = PromptLookupConfig(min_ngram=args.lookup_min_ngram, max_ngram=args.lookup_max_ngram,
                                num_tokens=args.lookup_tokens, max_candidates=args.lookup_candidates)
    spec = SpeculativeConfig(draft=args.draft, draft_tokens=args.draft_tokens)
    if args.max_new_tokens < 1:
        raise PromptError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    parse_dtype(args.dtype)  # an unsupported dtype is refused before the model loads
    if args.learned is not None:
        check_learned_file(args.learned)  # before the model loads: a writable folder, a readable file
    cache = None
    if args.ngram_cache is not None:
        cache = NGramCache.load(args.ngram_cache) if args.ngram_cache.exists() else NGramCache()
    loaded = load(args.model, dtype=args.dtype, pack=args.pack)
    if args.learned is not None and args.learned.exists():
        load_learned(loaded, args.learned)
    common = dict(max_new_tokens=args.max_new_tokens, lookahead=la, sampling=sampling, stop=args.stop, raw=args.raw,
                  adaptive=args.adaptive, exact=args.exact,
                  prompt_lookup=lookup, speculative=spec, ngram_cache=cache)
    try:
        return _run_loaded(args, loaded, prompt, common)
    finally:
        _save(args, loaded, cache)


def _save(args: argparse.Namespace, loaded: Any, cache: NGramCache | None) -> None:
    """Write back the n-gram cache and the learned state; each is tried, a failure is one error line."""
    failed = []
    if cache is not None:
        try:
            cache.save(args.ngram_cache)
        except OSError as exc:
            failed.append(f"could not write the n-gram cache to {args.ngram_cache}: {exc}")
    if args.learned is not None:
        try:
            save_learned(loaded, args.learned)
        except OSError as exc:
            failed.append(f"could not write the learned state to {args.learned}: {exc}")
    if failed:
        raise ConfigError("; ".join(failed))


def _run_loaded(args: argparse.Namespace, loaded: Any, prompt: str, common: dict[str, Any]) -> int:
    if args.compare:
        strategy = "lookahead" if args.strategy == "autoregressive" else args.strategy
        # the baseline must not warm the n-gram cache with the very response the strategy is about to produce,
        # nor the prefix cache with the very prompt (both runs prefill it whole: the whole-call times compare)
        ar = generate(loaded, prompt, strategy="autoregressive", **{**common, "ngram_cache": None}, prefix_cache=False)
        lk = generate(loaded, prompt, strategy=strategy, **common, prefix_cache=False)
        speedup = lk.stats.tokens_per_s / ar.stats.tokens_per_s if ar.stats.tokens_per_s else 0.0
        identical = ar.token_ids == lk.token_ids
        certs = [_certificate(args, loaded, prompt, r) for r in (ar, lk)]
        if args.json:
            print(json.dumps({"dtype": lk.dtype, "width_floor": lk.width_floor, "packed_linears": loaded.packed,
                              "autoregressive": _payload(ar, certs[0]), strategy: _payload(lk, certs[1]),
                              "speedup": speedup, "identical": identical}))
        else:
            _print_compare(loaded.name, _describe(args, strategy), ar, lk, speedup, identical)
            for r, cert in zip((ar, lk), certs):
                if cert is not None:
                    print(f"faithfulness [{r.strategy}]: {cert.describe()}")
        return 0 if identical else 1

    if args.stream and not args.json:
        result = None
        for event in stream_events(loaded, prompt, strategy=args.strategy, **common):
            print(event.text, end="", flush=True)
            result = event.result
        print()
        assert result is not None
        s = result.stats
        draft = f", draft {s.draft_steps} steps {s.draft_s:.2f} s" if s.draft_steps else ""
        print(f"[{result.strategy}] {s.new_tokens} tokens, {s.tokens_per_s:.1f} tok/s, "
              f"{s.tokens_per_step:.2f} tokens/step{draft}, finish={result.finish_reason}, {result.dtype}, "
              f"width floor {result.width_floor}", file=sys.stderr)
        cert = _certificate(args, loaded, prompt, result)
        if cert is not None:
            print(f"faithfulness: {cert.describe()}", file=sys.stderr)
        return 0
    result = generate(loaded, prompt, strategy=args.strategy, **common)
    cert = _certificate(args, loaded, prompt, result)
    if args.json:
        print(json.dumps(_payload(result, cert) | {"packed_linears": loaded.packed}))
    else:
        print(result.text)
        if cert is not None:
            print(f"faithfulness: {cert.describe()}", file=sys.stderr)
    return 0


def _certificate(args: argparse.Namespace, loaded: Any, prompt: str, r: GenerationResult) -> Certificate | None:
    if not args.certify:
        return None
    sampling = SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    return certify(loaded.model, loaded.encode(prompt, raw=args.raw), r.token_ids, sampling)


def _describe(args: argparse.Namespace, strategy: str) -> str:
    if strategy in ("lookahead", "lookahead_jacobi"):
        tail = f" context_tokens={args.context_tokens}" if args.context_tokens else ""
        return f"{strategy} W={args.window} N={args.ngram} G={args.guesses}{tail}"
    if strategy == "prompt_lookup":
        return (f"{strategy} ngram {args.lookup_min_ngram}..{args.lookup_max_ngram}, {args.lookup_tokens} tokens, "
                f"{args.lookup_candidates} candidates")
    return f"{strategy} draft={args.draft} k={args.draft_tokens}"


def _print_compare(model: str, described: str, ar: GenerationResult, lk: GenerationResult,
                   speedup: float, identical: bool) -> None:
    print(lk.text)
    print()
    # exact passes run at least floor rows wide, and wider where the cost curve says a wider pass is cheaper
    floor = ("unpadded" if not lk.width_floor else "exact, width floor 1" if lk.width_floor == 1
             else f"exact, steps at least {lk.width_floor} rows")
    print(f"model {model} ({lk.dtype}, {floor}), {described}")
    print(f"{'strategy':<16}{'tokens':>8}{'steps':>8}{'tok/step':>10}{'rows/step':>10}{'decode s':>10}{'tok/s':>9}"
          f"{'total s':>9}")
    for r in (ar, lk):
        s = r.stats
        print(f"{r.strategy:<16}{s.new_tokens:>8}{s.steps:>8}{s.tokens_per_step:>10.2f}"
              f"{s.processed_tokens / max(s.steps, 1):>10.1f}{s.decode_s:>10.2f}{s.tokens_per_s:>9.1f}{s.total_s:>9.2f}")
    print(f"speedup (decode tokens/s): {speedup:.2f}x   whole call: {ar.stats.total_s / lk.stats.total_s:.2f}x")
    print(f"token ids identical: {'yes' if identical else 'NO (see README: float rounding caveat)'}")
