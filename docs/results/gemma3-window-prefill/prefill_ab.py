"""Gemma 3's prompt pass past its 512-token sliding window: the banded causal kernel against the 4-D mask.

Until this change, a prompt longer than a sliding window ran every layer on the model's 4-D masks
(the fused SDPA over the cache's padded keys); now every layer runs the causal kernel over the prompt's
own keys, a sliding layer's banded to its window (engine/prefill_kernel.cpp in bfloat16). This times both
on the same prompts, interleaved (the old path is the same code with `causal_prompt` switched off, as
tests/engine/test_prefill.py's reference does), and checks that the first greedy tokens after each agree.

    python docs/results/gemma3-window-prefill/prefill_ab.py [--workload /tmp/wl] [--dtype float32]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
from pathlib import Path

import torch

import lookahead
from lookahead.engine import model_runner


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", type=Path, help="also report the gemma3 prompt lengths of these classes")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dtype", default="auto", help="auto (bfloat16 here: the kernel) or float32 (SDPA, banded)")
    ap.add_argument("--sizes", default="512,768,1024,1536,2048,3072")
    args = ap.parse_args()
    torch.set_num_threads(2)
    lm = lookahead.load("gemma3-270m", dtype=args.dtype)
    text = " ".join(f"Paragraph {i}: the committee met on day {i} and reviewed the {i % 7}th budget line."
                    for i in range(400))
    ids = lm.encode(text, raw=True)
    lookahead.generate(lm, ids[:64], max_new_tokens=2, strategy="autoregressive")  # warm up
    real = model_runner.causal_prompt
    old = lambda rows, window_of=None: contextlib.nullcontext() if window_of is not None and rows > 512 \
        else real(rows, window_of)  # noqa: E731  the old rule: the mask once a window is shorter
    rows = []
    for n in (int(x) for x in args.sizes.split(",")):
        times: dict[str, list[float]] = {"mask": [], "banded": []}
        tokens: dict[str, tuple[int, ...]] = {}
        for r in range(args.repeats):
            for arm in (("mask", "banded") if r % 2 == 0 else ("banded", "mask")):
                model_runner.causal_prompt = old if arm == "mask" else real
                res = lookahead.generate(lm, ids[:n], max_new_tokens=16, strategy="autoregressive")
                times[arm].append(res.stats.prefill_s)
                tokens[arm] = tuple(res.token_ids)
        model_runner.causal_prompt = real
        row = {"prompt_tokens": n, **{f"{a}_s": round(statistics.median(t), 3) for a, t in times.items()},
               "speedup": round(statistics.median(times["mask"]) / statistics.median(times["banded"]), 2),
               "same_16_tokens": tokens["mask"] == tokens["banded"]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.workload:
        for cls in ("summarization", "function_calling", "code", "chat"):
            with (args.workload / f"{cls}.jsonl").open() as f:
                lengths = sorted(len(lm.encode(json.loads(line)["messages"])) for line in f)
            share = sum(n > 512 for n in lengths) / len(lengths)
            print(json.dumps({"class": cls, "median_prompt_tokens": lengths[len(lengths) // 2],
                              "over_512": round(share, 2)}), flush=True)


if __name__ == "__main__":
    main()
