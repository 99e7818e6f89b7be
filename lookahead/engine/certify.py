"""A faithfulness certificate that works at any precision.

Lossless decoding promises the token sequence the model itself produces at the dtype it runs. At
bfloat16 that sequence can differ from what the same weights would pick in float32: the certificate
says how much. It teacher-forces the produced tokens through a higher-precision copy of the model
(float32 for bfloat16/float16 runs, float64 for float32 runs) in one plain causal forward and applies
the same choice rule (greedy argmax, or the seeded Gumbel rule of the request) at every produced
position. It reports how many produced tokens are not the reference's choice, where the first one is,
and the largest reference score gap among them (how far from a tie the reference was there).

Lookahead and autoregressive decoding produce the same sequence, so they get the same certificate.
"""

from __future__ import annotations

import copy
import math
import threading
import weakref
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from lookahead.config import GREEDY, SamplingConfig
from lookahead.engine.sampling import TokenChooser, process_logits
from lookahead.models.packing import unpack_linears


@dataclass(frozen=True)
class Certificate:
    tokens: int  # produced tokens checked
    mismatches: int  # of those, tokens that are not the reference's choice
    first_mismatch: int | None  # index (0 = first produced token) of the first one
    max_gap: float  # largest reference score(choice) - score(produced) among mismatches; 0.0 if none
    reference_dtype: str

    def to_dict(self) -> dict[str, object]:
        out = asdict(self)
        if not math.isfinite(self.max_gap):  # produced token outside the reference's top-k/top-p
            out["max_gap"] = None
        return out

    def describe(self) -> str:
        if not self.mismatches:
            return f"all {self.tokens} tokens are the {self.reference_dtype} reference's choice"
        return (f"{self.mismatches} of {self.tokens} tokens are not the {self.reference_dtype} reference's choice "
                f"(first at token {self.first_mismatch}, largest reference gap {self.max_gap:.3g})")


_references: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def reference_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype in (torch.float32, torch.float64) else torch.float32


def reference_model(model: Any) -> Any:
    """A higher-precision copy of `model`, made once per model."""
    with _lock:
        ref = _references.get(model)
        if ref is None:
            ref = copy.deepcopy(model)
            unpack_linears(ref)  # the reference runs PyTorch's plain kernels in its own dtype
            ref.to(reference_dtype(next(model.parameters()).dtype))
            ref.eval()
            _references[model] = ref
        return ref


def certify(model: Any, prompt_ids: Sequence[int], token_ids: Sequence[int],
            sampling: SamplingConfig = GREEDY) -> Certificate:
    """Check `token_ids` (produced after `prompt_ids`) against a higher-precision forward of `model`."""
    ref = reference_model(model)
    dtype = str(next(ref.parameters()).dtype).replace("torch.", "")
    n = len(token_ids)
    if n == 0:
        return Certificate(0, 0, None, 0.0, dtype)
    ids = torch.tensor([list(prompt_ids) + list(token_ids)[:-1]])
    with torch.no_grad():
        logits = ref(input_ids=ids).logits[0, len(prompt_ids) - 1 :]  # [n, V]: row i predicts token i
    vocab = min(logits.shape[-1], model.get_output_embeddings().weight.shape[0])
    logits = logits[:, :vocab].double()
    if sampling.greedy:
        scores = logits
    else:  # the request's own rule: processed logits plus the Gumbel noise of each absolute position
        chooser = TokenChooser(sampling, vocab)
        noise = torch.stack([chooser.gumbel(len(prompt_ids) + i) for i in range(n)]).double()
        scores = process_logits(logits, sampling).double() + noise
    choice = scores.argmax(dim=-1)
    produced = torch.tensor(list(token_ids))
    wrong = torch.nonzero(choice != produced).flatten()
    if wrong.numel() == 0:
        return Certificate(n, 0, None, 0.0, dtype)
    gaps = scores[wrong, choice[wrong]] - scores[wrong, produced[wrong]]
    return Certificate(n, int(wrong.numel()), int(wrong[0]), float(gaps.max()), dtype)
