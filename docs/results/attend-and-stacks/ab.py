"""A/B of one forward pass, before and after 7a55268 + 2024a52, in one process, interleaved.

"old": each stacked projection called as its own module (q, k, v; gate, up), and the exact attention
as three kernel calls (scores, softmax_, weighted) with the output's reshape in Python; "new": one
call per stack (packing.group_runner) and one `attend` call. Same model, same cache (256 keys),
the same rows; the logits are checked bit for bit first.

    python docs/results/attend-and-stacks/ab.py [ROUNDS]
"""

import statistics
import sys
import time

import torch

import lookahead
from lookahead.engine import exact_kernel
from lookahead.engine.kvcache import KVCache
from lookahead.engine.model_runner import ModelRunner, Rows
from lookahead.engine.numerics import KEY_ALIGN, width_probe

torch.set_num_threads(2)
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 30
WIDTHS, KEYS = (1, 4, 8), 256
model = lookahead.load("smollm2-135m-instruct", dtype="bfloat16").model
probe = width_probe(model)
runner = ModelRunner(model, probe.floor, exact_attention=probe.exact_attention, views=False, ceiling=probe.ceiling,
                     quantum=probe.quantum)
decoder, real = runner.lean, exact_kernel.kernel()


class ThreeCalls:
    """The extension, with `attend` as the three calls and the reshape the Python path made before."""

    def __getattr__(self, name):  # noqa: ANN001, ANN204
        return getattr(real, name)

    def attend(self, q, k, v, mask, scale):  # noqa: ANN001, ANN201
        probs = real.softmax_(real.scores(q, k, mask, scale))
        b, h, n, d = q.shape
        return real.weighted(probs, v).view(b, h, n, d).transpose(1, 2).contiguous()


arms = {"new": (real, list(decoder._parts)),
        "old": (ThreeCalls(), [p._replace(qkv=None, gate_up=None) for p in decoder._parts])}


def use(arm: str) -> None:
    exact_kernel._built["module"], decoder._parts = arms[arm]


cache = KVCache(KEY_ALIGN)
runner.prefill(cache, list(range(100, 100 + KEYS)))


def one(k: int) -> torch.Tensor:
    rows = Rows(torch.arange(5, 5 + k), torch.arange(KEYS, KEYS + k), torch.ones(k, k, dtype=torch.bool).tril_(),
                torch.arange(k))
    out = runner.forward_batch(cache, [rows])[0]
    cache.crop(KEYS - cache.get_seq_length())
    return out


for k in WIDTHS:
    use("old")
    a = one(k)
    use("new")
    assert torch.equal(a, one(k)), f"{k} rows: the logits differ"
times: dict[tuple[int, str], list[float]] = {}
for _ in range(ROUNDS):
    for k in WIDTHS:
        for arm in ("old", "new"):
            use(arm)
            one(k)
            t = time.perf_counter()
            for _ in range(5):
                one(k)
            times.setdefault((k, arm), []).append((time.perf_counter() - t) / 5)
print(f"{ROUNDS} rounds, logits identical at {WIDTHS} rows")
for k in WIDTHS:
    old, new = times[(k, "old")], times[(k, "new")]
    ratio = statistics.median(n / o for n, o in zip(new, old))
    print(f"{k} rows: old {1e3 * statistics.median(old):.2f} ms, new {1e3 * statistics.median(new):.2f} ms, "
          f"new/old per round (median) {ratio:.3f}")
