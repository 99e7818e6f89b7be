"""The model's call conventions in one place: 4-D masks, position ids, the cache keyword, which logit
rows to compute, and padding every pass up to the device's width floor.

Width floor (engine/numerics.py): at reduced precision a row's logits can depend on how many rows share
the forward pass (the matmul kernels pick their blocking by the number of rows). Above the floor they
do not, so a pass padded to at least `floor` rows, and with at least `floor` logit rows, computes every
row exactly as any other such pass would. Dummy rows go after the real ones and see only the cached
prefix and themselves; their keys are dropped before the call returns.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from dataclasses import dataclass
from typing import Any

import torch

from lookahead.engine.attention import exact_passes
from lookahead.engine.kvcache import KVCache
from lookahead.engine.masks import MaskBuilder


@dataclass
class ForwardTimer:
    seconds: float = 0.0
    calls: int = 0


class ModelRunner:
    """One model's forward pass. `floor`: pad every pass to at least this many query rows and logit
    rows (None: run unpadded). `exact_attention`: compute attention with engine/attention.py's
    width-invariant function (the model must have it installed)."""

    def __init__(self, model: Any, floor: int | None = None, exact_attention: bool = False) -> None:
        self.model = model
        self.floor = floor
        self.exact_attention = exact_attention
        self.masks = MaskBuilder(model.config, next(model.parameters()).dtype)
        params = inspect.signature(model.forward).parameters
        self.cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self.can_keep_logits = "logits_to_keep" in params
        self.timer = ForwardTimer()

    def forward(self, cache: KVCache, tokens: torch.Tensor, positions: torch.Tensor, local: torch.Tensor,
                keep: torch.Tensor, width: int = 0) -> torch.Tensor:
        """tokens/positions: [Q]; local: [Q, Q] bool; keep: [K] ascending row indices; width: run the pass
        at least this wide (dummy rows; see costs.CostCurve.pad_to). Appends Q entries to the cache and
        returns logits [K, V] for the `keep` rows."""
        q = int(tokens.shape[0])
        pad = max(0, self.floor or 0, width) - q
        pad = max(pad, 0)
        if pad:  # dummy rows after the real ones: each sees the prefix and itself only
            tokens = torch.cat([tokens, tokens[:1].expand(pad)])
            positions = torch.cat([positions, positions[:1].expand(pad)])
            grown = torch.zeros(q + pad, q + pad, dtype=torch.bool)
            grown[:q, :q] = local
            grown[range(q, q + pad), range(q, q + pad)] = True
            local = grown
        rows = keep
        if self.floor and keep.numel() < self.floor:  # the LM head gets >= floor rows too
            extra = torch.ones(q + pad, dtype=torch.bool)
            extra[keep] = False
            rows = torch.cat([keep, torch.nonzero(extra).flatten()[: self.floor - keep.numel()]]).sort().values
        mask = self.masks.build(cache.get_seq_length(), positions, local, cache.key_width(q + pad))
        kwargs: dict[str, Any] = {self.cache_kwarg: cache, "use_cache": True}
        full = rows.numel() == q + pad  # every row: no gather needed
        if self.can_keep_logits and not full:
            kwargs["logits_to_keep"] = rows
        start = time.perf_counter()
        with torch.no_grad(), exact_passes() if self.exact_attention else contextlib.nullcontext():
            out = self.model(input_ids=tokens[None], position_ids=positions[None], attention_mask=mask, **kwargs)
        self.timer.seconds += time.perf_counter() - start
        self.timer.calls += 1
        logits = out.logits[0]  # [R, V] (R = len(rows), or every row when the model cannot skip any)
        if pad:
            cache.crop(-pad)
        if logits.shape[0] != rows.numel():
            logits = logits[rows]
        if rows is not keep:
            logits = logits[torch.searchsorted(rows, keep)]
        return logits

    def prefill(self, cache: KVCache, tokens: list[int]) -> None:
        """Append `tokens` after what the cache holds (positions follow on), in one causal pass; no
        logits are read back."""
        n = len(tokens)
        if not n:
            return
        p = cache.get_seq_length()
        local = torch.ones(n, n, dtype=torch.bool).tril_()
        self.forward(cache, torch.tensor(tokens), torch.arange(p, p + n), local, keep=torch.tensor([n - 1]))
