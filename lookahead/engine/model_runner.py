"""The model's call conventions in one place: 4-D masks, position ids, the cache keyword, which logit
rows to compute, and padding every pass up to the device's width floor.

Width floor (engine/numerics.py): at reduced precision a row's logits can depend on how many rows share
the forward pass (the matmul kernels pick their blocking by the number of rows). Above the floor they
do not, so a pass padded to at least `floor` rows, and with at least `floor` logit rows, computes every
row exactly as any other such pass would. Dummy rows go after the real ones and see only the cached
prefix and themselves; their keys are dropped before the call returns (with an aligned tree's offsets,
those that fill its gaps stay, masked, until the step compacts the cache).
"""

from __future__ import annotations

import contextlib
import inspect
import time
from dataclasses import dataclass
from collections.abc import Sequence
from typing import Any

import torch

from lookahead.engine.attention import KeyView, causal_prompt, exact_passes
from lookahead.engine.kvcache import KVCache
from lookahead.engine.masks import MaskBuilder
from lookahead.engine.query import free_offsets
from lookahead.engine.value_sums import KEY_CHUNK, model_key_chunk
from lookahead.models.lean import lean_decoder


@dataclass(frozen=True)
class Rows:
    """One sequence's query rows in a pass: tokens/positions [Q], local [Q, Q] bool (row i may see new
    key j), keep [K] ascending rows whose logits are read back, views: (rows, path) pairs whose rows
    are computed over the keys of the cached prefix and the path's rows, in that order (engine/query.py
    branch_views; needs the exact attention); offsets: [Q] distinct, where the cache writes each row's
    key after the prefix (engine/query.py align_tree; None: one after another)."""

    tokens: torch.Tensor
    positions: torch.Tensor
    local: torch.Tensor
    keep: torch.Tensor
    views: tuple[tuple[list[int], list[int]], ...] = ()
    offsets: torch.Tensor | None = None  # [Q] distinct: where the cache writes each row's key (None: in order)

    def padded(self, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """tokens, positions, local, offsets grown to `width` rows with dummies that see the prefix and
        themselves (their keys in the first offsets the real rows leave free)."""
        q = int(self.tokens.shape[0])
        offsets = torch.arange(q) if self.offsets is None else self.offsets
        pad = width - q
        if pad <= 0:
            return self.tokens, self.positions, self.local, offsets
        local = torch.zeros(width, width, dtype=torch.bool)
        local[:q, :q] = self.local
        local[range(q, width), range(q, width)] = True
        return (torch.cat([self.tokens, self.tokens[:1].expand(pad)]),
                torch.cat([self.positions, self.positions[:1].expand(pad)]), local,
                torch.cat([offsets, free_offsets(offsets, pad)]))


def _stack(masks: list[Any]) -> Any:
    """Per-sequence masks [1, 1, Q, K] (or dicts of them) -> [B, 1, Q, K] (or a dict)."""
    if len(masks) == 1:
        return masks[0]
    if isinstance(masks[0], dict):
        return {kind: torch.cat([m[kind] for m in masks]) for kind in masks[0]}
    return torch.cat(masks)


FINAL_NORMS = ("norm", "ln_f", "final_layernorm", "final_layer_norm")  # the decoder's last norm, by family


def final_norm(model: Any) -> torch.nn.Module | None:
    """The decoder's last normalisation (Llama, Qwen, Mistral, Gemma: `norm`; GPT-2: `ln_f`): its output
    [B, Q, D] is every row's final hidden state, the LM head's input. None: not found under a known name."""
    get = getattr(model, "get_decoder", None)
    decoder = get() if callable(get) else None
    for name in FINAL_NORMS:
        module = getattr(decoder, name, None)
        if isinstance(module, torch.nn.Module):
            return module
    return None


@dataclass
class ForwardTimer:
    seconds: float = 0.0
    calls: int = 0


class ModelRunner:
    """One model's forward pass. `floor`: pad every pass to at least this many query rows and logit
    rows (None: run unpadded). `exact_attention`: compute attention with engine/attention.py's
    width-invariant function (the model must have it installed). `batch_exact`: the width probe found
    that sequences batched into a pass of >= floor rows need no padding of their own. `views`: passes
    compute tree branches over key views (Rows.views; needs the exact attention). `ceiling`: the most query
    rows one pass may carry, all sequences together (engine/numerics.py: wider passes compute rows
    otherwise; None: no limit); padding stops there, and a pass that needs more rows is refused.
    `quantum`: each sequence's rows (and the logit rows) are padded to a multiple of this (the probe's
    quantum: rows past the last full block of a matmul came out otherwise)."""

    def __init__(self, model: Any, floor: int | None = None, exact_attention: bool = False,
                 batch_exact: bool = False, views: bool = False, ceiling: int | None = None,
                 quantum: int = 1) -> None:
        if views and not exact_attention:
            raise ValueError("key views need the exact attention (engine/attention.py)")
        self.model = model
        self.floor = floor
        self.ceiling = ceiling
        self.quantum = quantum
        self.batch_exact = batch_exact
        self.exact_attention = exact_attention
        self.views = views
        self.key_chunk = model_key_chunk(model) if exact_attention else KEY_CHUNK
        self.masks = MaskBuilder(model.config, next(model.parameters()).dtype)
        params = inspect.signature(model.forward).parameters
        self.cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self.can_keep_logits = "logits_to_keep" in params
        self.timer = ForwardTimer()
        # the model's forward without transformers' per-call machinery, same bits (models/lean.py); None:
        # the model is not one it knows (or LOOKAHEAD_LEAN_FORWARD=0), call the model itself
        self.lean = lean_decoder(model)
        # Final hidden states, read off the decoder's last norm by a forward hook for the passes that ask
        self._norm = final_norm(model)
        self.states: torch.Tensor | None = None  # [B, Q, D]: the last pass's, when it asked (`forward_batch`)

    def _keep_states(self, module: Any, inputs: Any, output: torch.Tensor) -> None:
        self.states = output

    def row_floor(self, batch: int) -> int:
        """The fewest rows each of `batch` sequences must carry for exact rows: the floor, or, where the
        probe found batching exact, the floor shared among the batch."""
        if not self.floor:
            return 1
        return self.whole(-(-self.floor // batch) if self.batch_exact else self.floor)

    def whole(self, rows: int) -> int:
        """`rows` rounded up to a multiple of the quantum."""
        return -(-rows // self.quantum) * self.quantum

    def room(self, batch: int) -> int | None:
        """The most rows each of `batch` sequences may carry within the ceiling (None: no limit)."""
        return None if self.ceiling is None else self.ceiling // batch // self.quantum * self.quantum

    def fits(self, batch: int) -> bool:
        """Can `batch` sequences, each at its fewest rows, share one exact pass within the ceiling?"""
        room = self.room(batch)
        return room is None or self.row_floor(batch) <= room

    def pass_width(self, batch: int, rows: int, width: int = 0) -> int:
        """The rows each of `batch` sequences carries in a pass whose widest has `rows` real rows, asked
        to run at least `width` wide: at least the floor, a multiple of the quantum, padded up to `width`
        within the ceiling."""
        q = self.whole(max(rows, self.row_floor(batch)))
        room = self.room(batch)
        if room is not None and q > room:
            raise ValueError(f"a pass of {batch} x {q} query rows is wider than the widest exact pass "
                             f"({self.ceiling} rows, engine/numerics.py): size steps within it (the scheduler "
                             "does) or run unpadded")
        return max(q, self.whole(width) if room is None else min(self.whole(width), room))

    def forward(self, cache: KVCache, tokens: torch.Tensor, positions: torch.Tensor, local: torch.Tensor,
                keep: torch.Tensor, width: int = 0) -> torch.Tensor:
        """One sequence's pass (the batch-of-one case of `forward_batch`): tokens/positions: [Q]; local:
        [Q, Q] bool; keep: [K] ascending row indices; width: run the pass at least this wide (dummy rows;
        see costs.CostCurve.pad_to). Appends Q entries to the cache and returns logits [K, V]."""
        return self.forward_batch(cache, [Rows(tokens, positions, local, keep)], width)[0]

    def forward_batch(self, cache: KVCache, parts: Sequence[Rows], width: int = 0,
                      fused: bool = False, states: bool = False) -> list[torch.Tensor]:
        """One pass over the cache's selected slots, part b in slot b. Every part is padded to the same
        width Q (the widest part, the floor, `width`) with dummy rows after its real ones; each dummy row
        sees its slot's prefix and itself, and its keys are dropped before the call returns (keys left in
        an aligned tree's gaps stay until the step compacts the cache; masked meanwhile). Appends each
        part's real rows to its slot and returns its logits [K_b, V] for its `keep` rows. `fused`: use
        the model's own attention kernel even where this runner computes exact attention (see `prefill`).
        `states`: also keep every row's final hidden state in `self.states` [B, Q, D] (rows as passed, padded
        to Q; None where `final_norm` found no final norm in the model)."""
        lengths = cache.slot_lengths()
        if len(lengths) != len(parts):
            raise ValueError(f"{len(parts)} parts for a pass over {len(lengths)} cache slots")
        least = self.row_floor(len(parts))
        widest = max(int(p.tokens.shape[0]) for p in parts)
        # a fused pass (a prompt's prefill) claims no exact rows: the ceiling is for the exact ones
        q = max(widest, least, width) if fused else self.pass_width(len(parts), widest, width)
        padded = [p.padded(q) for p in parts]
        # Logit rows: every row some part keeps; the LM head gets >= floor rows, a multiple of the quantum
        # (engine/numerics.py). (Python sets: a pass keeps ~5-20 rows.)
        kept = set().union(*(p.keep.tolist() for p in parts))
        need = max(least, self.whole(len(kept))) if not fused else least
        if len(kept) < need:
            kept.update([r for r in range(q) if r not in kept][: need - len(kept)])
        rows = torch.tensor(sorted(kept), dtype=torch.long)  # [R] ascending
        # some keys go to chosen offsets (engine/query.py align_tree; a chain's offsets are in order)
        placed = any(p.offsets is not None and not torch.equal(o, torch.arange(q)) for p, (*_, o) in zip(parts, padded))
        # [B] entries each slot's pass spans (gaps included)
        spans = [q if p.offsets is None else int(o.max()) + 1 for p, (*_, o) in zip(parts, padded)]
        key_width = cache.key_width(spans)  # exactly the key count the cache will hand the model
        exact = self.exact_attention and not fused
        # the exact attention adds the mask in float32 (float64 stays): built so, not converted per layer
        mask_dtype = torch.promote_types(self.masks.dtype, torch.float32) if exact else None
        masks = [self.masks.build(n, pos, loc, key_width, o if placed else None, mask_dtype)
                 for n, (_, pos, loc, o) in zip(lengths, padded)]
        kwargs: dict[str, Any] = {self.cache_kwarg: cache, "use_cache": True}
        full = rows.numel() == q  # every row: no gather needed
        if self.can_keep_logits and not full:
            kwargs["logits_to_keep"] = rows
        views = [KeyView(b, torch.tensor(rows), torch.cat([torch.arange(n), n + torch.tensor(path)]))
                 for b, (n, p) in enumerate(zip(lengths, parts)) for rows, path in p.views]
        if views and (fused or not self.views):
            raise ValueError("this pass computes no key views: build the runner with views=True (exact attention)"
                             " and do not ask for the fused kernel")
        tokens = torch.stack([t for t, *_ in padded]) if len(padded) > 1 else padded[0][0][None]  # [B, Q]
        positions = torch.stack([pos for _, pos, *_ in padded]) if len(padded) > 1 else padded[0][1][None]  # [B, Q]
        if placed:
            cache.place([o for *_, o in padded])
        mask = _stack(masks)
        self.states = None
        # hooked for this pass only: a hook left on the model would outlive this runner (one per request)
        hook = self._norm.register_forward_hook(self._keep_states) if states and self._norm is not None else None
        start = time.perf_counter()
        try:
            with torch.no_grad(), exact_passes(views, self.key_chunk) if exact else contextlib.nullcontext():
                out = (self.lean or self.model)(input_ids=tokens, position_ids=positions, attention_mask=mask,
                                                **kwargs)
        finally:
            cache.place(None)
            if hook is not None:
                hook.remove()
        self.timer.seconds += time.perf_counter() - start
        self.timer.calls += 1
        logits = out.logits  # [B, R, V] (R = len(rows), or every row when the model cannot skip any)
        if logits.shape[1] != rows.numel():
            logits = logits[:, rows]
        # Drop the dummy rows' keys past the real rows' span. Dummies take the first offsets the real rows
        # leave free, so some may sit in an aligned tree's gaps: those stay (masked for every real row)
        # until the step's compaction (engine/step.py) keeps only the accepted entries.
        for slot, (n, p, span) in enumerate(zip(lengths, parts, spans)):
            real = int(p.tokens.shape[0])
            if real < q or (placed and span > real):
                end = real if p.offsets is None else int(p.offsets.max()) + 1
                cache.keep(n, torch.arange(end), slot=cache.selection.lo + slot)
        # each part's keep rows among the pass's logit rows (all of them, in order, when it keeps every one)
        return [logits[b] if p.keep.numel() == rows.numel() else logits[b, torch.searchsorted(rows, p.keep)]
                for b, p in enumerate(parts)]

    def prefill(self, cache: KVCache, tokens: list[int], states: bool = False,
                continued: bool = False) -> torch.Tensor | None:
        """Append `tokens` after what the cache holds (positions follow on), in one causal pass; no
        logits are read back. `states`: return the tokens' final hidden states [n, D] (None where the
        model's final norm was not found, or no token was given). `continued`: the cache holds the first
        tokens of the same prompt (engine/prefix_cache.py put them there), so the pass runs the causal
        kernel after them, as the rest of a one-pass prefill (the same bits where the prefix is a multiple
        of 8 tokens and the prefill kernel runs; the prefix cache checks that before it reuses anything).

        The pass runs a fused attention kernel, not the exact one: no logit of it is read, and every way
        of decoding a prompt (autoregressive, lookahead, batched or alone) caches it with this same one
        pass, so every decoding step sees the same prompt keys and values whichever kernel made them. The
        exact attention materialises float32 scores for every query row and key (a 1,500-token prompt
        took 2.6x as long, SmolLM2 bf16 on 2 Zen 4 cores); decoding rows are few. Into an empty cache it
        is a causal kernel over the prompt's own keys, a sliding-window layer's within its window
        (attention.causal_prompt; SDPA's: 841 tokens 0.90 -> 0.77 s there; in bfloat16 lookahead's own,
        engine/prefill_kernel.cpp), not the model's SDPA over the 4-D mask."""
        n = len(tokens)
        if not n:
            return None
        p = cache.get_seq_length()
        local = torch.ones(n, n, dtype=torch.bool).tril_()
        # an empty cache, or a prompt's own first tokens: every layer's mask is causal (a sliding layer's
        # within its window) over the prompt so far
        causal = p == 0 or continued
        rows = Rows(torch.tensor(tokens), torch.arange(p, p + n), local, torch.tensor([n - 1]))
        windowed = any(w is not None for w in self.masks.kinds.values())
        with causal_prompt(n, self.masks.window if windowed else None, p) if causal else contextlib.nullcontext():
            self.forward_batch(cache, [rows], fused=True, states=states)
        return self.states[0] if states and self.states is not None else None
