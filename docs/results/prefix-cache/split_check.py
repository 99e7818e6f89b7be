import sys, torch, lookahead
from lookahead.engine.step import StepRunner
from lookahead.engine.numerics import width_probe
from lookahead.engine.sampling import TokenChooser
from lookahead.config import GREEDY
from lookahead.workloads.format import parse_workload
torch.set_num_threads(2)
name = sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m-instruct"
dtype = sys.argv[2] if len(sys.argv) > 2 else "bfloat16"
M = lookahead.load(name, dtype=dtype)
num = width_probe(M.model, 64)
runner = StepRunner(M.model, TokenChooser(GREEDY, M.model.get_output_embeddings().weight.shape[0]), num)
rs = parse_workload("/tmp/wl/function_calling.jsonl")
ids = M.encode(rs[3].chat(), raw=False)
toks = ids[:-1]
print(len(toks))
def kv(splits):
    c = runner.new_cache(1); c.select(0, 1)
    prev = 0
    for s in list(splits) + [len(toks)]:
        runner.model.prefill(c, toks[prev:s], continued=prev > 0)
        prev = s
    return [(l._k[0, :, :len(toks)].clone(), l._v[0, :, :len(toks)].clone()) for l in c.layers]
cold = kv([])
for splits in ([256], [8], [16, 64], [200], [128, 256, 384], [251], [len(toks) - 1]):
    w = kv(splits)
    bad = sum(not (torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])) for a, b in zip(cold, w))
    md = max(float((a[0].float() - b[0].float()).abs().max()) for a, b in zip(cold, w))
    print(splits, "layers differing", bad, "of", len(cold), "max|dk|", md)
