"""Is the kernel's prefill as accurate as SDPA's? The same prompts prefilled by the bfloat16 model with each
kernel and by the float32 model (the same weights): each bfloat16 cache's error against the float32 one,
and the last prompt row's logits (argmax agreement with float32, largest error)."""
import json, os, sys, torch
torch.set_num_threads(2)
import lookahead
from lookahead.engine import exact_kernel
from lookahead.engine.kvcache import KVCache
from lookahead.engine.model_runner import ModelRunner, Rows
from lookahead.bench.prompts import PROMPTS
WL = os.environ.get("WL", "workloads")
bf = lookahead.load("smollm2-135m-instruct", dtype="bfloat16")
f32 = lookahead.load("smollm2-135m-instruct", dtype="float32", probe=False)
texts = [[{"role": "user", "content": p}] for p in PROMPTS.values()]
for cls in ["code", "function_calling", "summarization"]:
    texts += [json.loads(l)["messages"] for l in list(open(f"{WL}/{cls}.jsonl"))[:4]]
def prefill(lm, ids):
    runner = ModelRunner(lm.model); cache = KVCache(256)
    runner.prefill(cache, ids[:-1])
    logits = runner.forward(cache, torch.tensor(ids[-1:]), torch.tensor([len(ids) - 1]), torch.ones(1, 1, dtype=torch.bool), torch.tensor([0]))
    return cache, logits[0].float()
tot = {"0": [0.0, 0.0, 0, 0.0], "1": [0.0, 0.0, 0, 0.0]}
for msgs in texts:
    ids = bf.encode(msgs)
    ref_cache, ref_logits = prefill(f32, ids)
    for arm in ("0", "1"):
        os.environ[exact_kernel.PREFILL_ENV] = arm
        cache, logits = prefill(bf, ids)
        err = sum(float((a.keys.float()[..., :len(ids) - 1, :] - b.keys[..., :len(ids) - 1, :]).abs().mean()) for a, b in zip(cache.layers, ref_cache.layers)) / len(cache.layers)
        verr = sum(float((a.values.float()[..., :len(ids) - 1, :] - b.values[..., :len(ids) - 1, :]).abs().mean()) for a, b in zip(cache.layers, ref_cache.layers)) / len(cache.layers)
        t = tot[arm]; t[0] += err; t[1] += verr; t[2] += int(logits.argmax() == ref_logits.argmax()); t[3] += float((logits - ref_logits).abs().max())
n = len(texts)
for arm, name in (("0", "SDPA"), ("1", "kernel")):
    t = tot[arm]
    print(f"{name:6s}: {n} prompts, mean |key - float32| {t[0]/n:.5f}, mean |value - float32| {t[1]/n:.5f}, "
          f"next token = float32's {t[2]}/{n}, mean largest logit error {t[3]/n:.4f}")
