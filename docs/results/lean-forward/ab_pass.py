"""Interleaved pass timings: the model's own forward, the lean forward on PyTorch ops, the lean forward
with the rotary/norm kernel; logits compared bit for bit. SmolLM2-135M bf16, 2 threads, 256 cached keys."""
import os, sys, time, statistics, json, torch, lookahead
from lookahead.engine.numerics import width_probe, KEY_ALIGN
from lookahead.engine.kvcache import KVCache
from lookahead.engine.model_runner import ModelRunner, Rows
torch.set_num_threads(2)
M = lookahead.load("smollm2-135m-instruct", dtype="bfloat16")
probe = width_probe(M.model)
def runner():
    return ModelRunner(M.model, probe.floor, exact_attention=probe.exact_attention, views=False,
                       ceiling=probe.ceiling, quantum=probe.quantum)
os.environ["LOOKAHEAD_LEAN_FORWARD"] = "0"; own = runner()
del os.environ["LOOKAHEAD_LEAN_FORWARD"]; lean_ops = runner(); lean_ops.lean._kernel_parts = False
lean_kern = runner(); assert lean_kern.lean._kernel_parts, "kernel parts off"
arms = {"own": own, "lean-ops": lean_ops, "lean-kernel": lean_kern}
keys = int(sys.argv[1]) if len(sys.argv) > 1 else 256
cache = KVCache(KEY_ALIGN)
own.prefill(cache, list(range(100, 100 + keys)))
def rows(k):
    return Rows(torch.arange(5, 5 + k), torch.arange(keys, keys + k), torch.ones(k, k, dtype=torch.bool).tril_(), torch.arange(k))
def one(r, k):
    out = r.forward_batch(cache, [rows(k)])[0]; cache.crop(keys - cache.get_seq_length()); return out
res = {}
for k in (1, 4, 8):
    outs = {a: one(r, k) for a, r in arms.items()}
    same = all(torch.equal(outs["own"], o) for o in outs.values())
    ts = {a: [] for a in arms}
    for _ in range(3):
        for r in arms.values(): one(r, k)
    for _ in range(40):
        for a, r in arms.items():
            t = time.perf_counter(); one(r, k); ts[a].append(time.perf_counter() - t)
    med = {a: 1e3 * statistics.median(v) for a, v in ts.items()}
    res[k] = med
    print(f"{k} rows over {keys} keys: " + "  ".join(f"{a} {m:.2f} ms" for a, m in med.items())
          + f"  own/lean-kernel {med['own'] / med['lean-kernel']:.3f}  identical {same}", flush=True)
print(json.dumps({"keys": keys, "ms": res}))
