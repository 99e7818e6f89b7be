"""What gumbel_choice (engine/gumbel_kernel.cpp) computes on recorded SmolLM2 rows: per row, how many tokens
pass its screen and get their noise computed in double (between two counts: with L fixed at the best
logit's lower end, where the walk starts, and at the row's final L, where it ends), and how far PyTorch's
float32 noise lies from the double one (the kernel allows 1e-3; engine/sampling.py checks 1e-5).
    python tokens_computed.py ROWS.pt:TEMPERATURE ...   (rows from ../sampled-top-p/record_rows.py)"""
import sys

import torch

from lookahead.engine import sampling

SLACK = 1e-3


def noise(u: torch.Tensor) -> torch.Tensor:  # the rule's noise in double
    return -torch.log(-torch.log(u.double().clamp(min=sampling._U_MIN_F, max=sampling._U_MAX_F)))


# bound[j]: the largest noise of a draw with floor(log2(1 - u)) = -j, plus the slack (as the kernel's table)
bound = torch.tensor([float(noise(torch.tensor([1 - 2.0 ** -min(max(j, 1), 24)]))) + SLACK for j in range(32)],
                     dtype=torch.float64)
for arg in sys.argv[1:]:
    path, temperature = arg.split(":")
    rows = torch.load(path)
    first, last, far = [], [], 0.0
    for r in range(rows.shape[0]):
        q = rows[r].float().double() / float(temperature)
        u = sampling.uniform(5000 + r, rows.shape[1])
        g = noise(u)
        far = max(far, float((g - sampling.gumbel_noise(u).double()).abs().max()))
        j = (-torch.floor(torch.log2(1 - u.double()))).long().clamp(0, 31)
        at = int(q.argmax())
        start, end = float(q[at] + g[at]) - SLACK, float((q + g).max()) - SLACK
        first.append(int((q + bound[j] >= start).sum()))
        last.append(int((q + bound[j] >= end).sum()))
    first.sort(), last.sort()
    n = len(first)
    print(f"{path} T={temperature}: {n} rows; tokens computed, L at the start: median {first[n // 2]}, p90 "
          f"{first[int(0.9 * n)]}, max {first[-1]}; L at the end: median {last[n // 2]}, p90 {last[int(0.9 * n)]}, "
          f"max {last[-1]}; max |PyTorch's noise - double| {far:.2e}")
