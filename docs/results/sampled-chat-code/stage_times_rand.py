"""stage_times.py (../step-overhead) with the sampling noise's uniform draws on torch.rand instead of
lookahead's kernel (engine/uniform_kernel.cpp): the same values, PyTorch's per-value generator calls.
Usage: as stage_times.py, e.g. `python stage_times_rand.py autoregressive,lookahead 10 /tmp/wls/chat_t07.jsonl`."""
import runpy
import sys
from pathlib import Path

import torch

from lookahead.engine import sampling

sampling.uniform = lambda seed, n: torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)
here = Path(__file__).resolve().parent.parent / "step-overhead"
sys.path.insert(0, str(here))
sys.argv[0] = str(here / "stage_times.py")
runpy.run_path(str(here / "stage_times.py"), run_name="__main__")
