"""A KV cache of request slots that grows in place and can keep an arbitrary subset of a step's new entries.

transformers' DynamicLayer concatenates on every update (a full copy of the cache per step). This
layer keeps a preallocated buffer per layer, writes new keys/values in place, and returns views.
Every layer keeps all keys (no sliding-window eviction): sliding windows are enforced in the mask,
because a step's speculative tokens would otherwise evict keys that the accepted prefix still needs.

Slots (continuous batching): the buffers' batch dimension holds one request per slot, each with its
own length. A pass runs over the selected slots `lo .. hi-1` (`select`); slot b's Q new entries are
written at its own length, and the model sees keys 0 .. max length + Q (padded to `key_align`); the
mask (engine/masks.py) hides from each slot the keys past its own. The scheduler keeps its active
requests in slots 0 .. B-1, so a pass over all of them reads views, never copies. A single request is
the one-slot case.

Key alignment (`key_align`): attention kernels reduce over the keys in vector-wide chunks and add the
last `length % chunk` keys one by one, so the same visible keys can be summed in a different order
when the total key count differs (an autoregressive step and a lookahead step over the same position
have different key counts). With key_align = A, `update` hands the model keys and values padded up to
a multiple of A (masked for every query by the step's mask), so every visible key lands in the same
full chunk whatever the step's width or its batch companions. Buffers start zeroed, so masked
entries are always finite and get weight exactly 0.

Placed entries (`place`): a pass may write its Q new entries of a slot at chosen offsets after the slot's
length instead of one after another (engine/query.py `align_tree` lays a tree's branches out so
that each branch's keys keep their autoregressive indices modulo the kernels' period). The slot then
spans length + (largest offset + 1); the entries between are left as they were (finite, masked).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from transformers.cache_utils import Cache, DynamicLayer

from lookahead.engine import exact_kernel


class Selection:
    """The slots the next pass runs over, shared by a cache and its layers."""

    def __init__(self, slots: int | None) -> None:
        self.slots = slots  # None: the batch size of the first update
        self.lo = 0
        self.hi: int | None = None  # None: every slot
        self.offsets: list[torch.Tensor] | None = None  # per selected slot, where its new entries go (None: in order)
        self.spans: list[int] = []  # per selected slot, the largest offset + 1
        self.at: list[torch.Tensor] = []  # per selected slot, its length + offsets (every layer has the same lengths)


class GrowableLayer(DynamicLayer):
    """keys/values: views [B, H, length, D] of the selected slots into buffers [S, H, capacity, D]."""

    def __init__(self, key_align: int = 1, selection: Selection | None = None) -> None:
        super().__init__()
        self.key_align = key_align
        self.selection = selection if selection is not None else Selection(None)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        slots = self.selection.slots or key_states.shape[0]
        self.selection.slots = slots
        self.lengths = [0] * slots
        self._k = key_states.new_zeros((0, key_states.shape[1], 0, key_states.shape[-1]))  # slots grow on use
        self._v = value_states.new_zeros((0, value_states.shape[1], 0, value_states.shape[-1]))

    @property
    def length(self) -> int:
        """The longest selected slot's length."""
        lo, hi = self._span()
        return max(self.lengths[lo:hi])

    def _span(self) -> tuple[int, int]:
        s = self.selection
        return s.lo, s.hi if s.hi is not None else len(self.lengths)

    def _reserve(self, needed: int, slots: int) -> None:
        """Room for `needed` entries in slots 0 .. slots-1. Buffers grow by doubling, in entries and in
        slots (a batch of 16 that has held one request so far has one slot's buffers, not sixteen's:
        measured, passes over a slot of a 16-slot buffer ran ~6% slower)."""
        have_slots, have = self._k.shape[0], self._k.shape[-2]
        if needed <= have and slots <= have_slots:
            return
        capacity = max(needed, 2 * have, 256) if needed > have else have
        rows = min(max(slots, 2 * have_slots), len(self.lengths)) if slots > have_slots else have_slots
        for name in ("_k", "_v"):
            old = getattr(self, name)
            new = old.new_zeros((rows, old.shape[1], capacity, old.shape[-1]))
            new[: old.shape[0], :, : old.shape[-2]] = old
            setattr(self, name, new)

    def _views(self, end: int) -> None:
        """keys/values become the selected slots' first `end` entries, sliced when next read: a step's
        compaction and crops change every layer's length, and only the next pass reads the views."""
        self._end, self._stale = end, True

    def _refresh(self) -> None:
        lo, hi = self._span()
        self._keys, self._values = self._k[lo:hi, :, : self._end], self._v[lo:hi, :, : self._end]
        self._stale = False

    @property
    def keys(self) -> torch.Tensor | None:  # type: ignore[override]
        if getattr(self, "_stale", False):
            self._refresh()
        return self._keys

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:
        self._keys = value

    @property
    def values(self) -> torch.Tensor | None:  # type: ignore[override]
        if getattr(self, "_stale", False):
            self._refresh()
        return self._values

    @values.setter
    def values(self, value: torch.Tensor | None) -> None:
        self._values = value

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """key_states/value_states: [B, H, Q, D] for the B selected slots; each slot's go after its own
        length. Returns keys/values [B, H, K, D], K = the longest slot's new length padded to key_align."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        lo, hi = self._span()
        if key_states.shape[0] != hi - lo:
            raise ValueError(f"a pass over {hi - lo} cache slots got keys for {key_states.shape[0]}")
        n = key_states.shape[-2]
        starts = self.lengths[lo:hi]
        placed = self.selection.offsets
        spans = [n] * (hi - lo) if placed is None else self.selection.spans
        end = max(s + w for s, w in zip(starts, spans))
        padded = -(-end // self.key_align) * self.key_align
        self._reserve(padded, hi)
        if placed is None and min(starts) == end - n:  # every slot at the same length, in order: one block write
            self._k[lo:hi, :, end - n : end] = key_states
            self._v[lo:hi, :, end - n : end] = value_states
        elif placed is not None:  # each slot's entries at its offsets (one indexed copy per slot)
            for b, at in enumerate(self.selection.at):
                self._k[lo + b].index_copy_(1, at, key_states[b])
                self._v[lo + b].index_copy_(1, at, value_states[b])
        else:
            b = torch.arange(lo, hi).repeat_interleave(n)  # [B*Q]
            t = (torch.tensor(starts)[:, None] + torch.arange(n)).flatten()  # [B*Q]
            self._k[b, :, t] = key_states.transpose(1, 2).flatten(0, 1)  # [B*Q, H, D]
            self._v[b, :, t] = value_states.transpose(1, 2).flatten(0, 1)
        for s, w in zip(range(lo, hi), spans):
            self.lengths[s] += w
        self._views(padded)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def keep(self, prefix: int, rows: torch.Tensor, slot: int | None = None) -> None:
        """Keep entries [0, prefix) plus entries prefix + rows (rows ascending), drop the rest, in `slot`
        (None: every selected slot)."""
        lo, hi = self._span() if slot is None else (slot, slot + 1)
        n = rows.numel()
        if n:
            src = rows + prefix
            self._k[lo:hi, :, prefix : prefix + n] = self._k[lo:hi].index_select(-2, src)
            self._v[lo:hi, :, prefix : prefix + n] = self._v[lo:hi].index_select(-2, src)
        for s in range(lo, hi):
            self.lengths[s] = prefix + n
        self._views(self.length)

    def set_length(self, slot: int, length: int) -> None:
        self.lengths[slot] = length
        self._views(self.length)

    def load(self, slot: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Slot `slot` holds exactly keys/values [H, n, D] (a stored prompt prefix: engine/prefix_cache.py)."""
        if not self.is_initialized:
            self.lazy_initialization(keys[None], values[None])
        n = keys.shape[-2]
        self._reserve(-(-n // self.key_align) * self.key_align, slot + 1)
        self._k[slot, :, :n] = keys
        self._v[slot, :, :n] = values
        self.set_length(slot, n)

    def move(self, src: int, dst: int) -> None:
        """Copy slot `src`'s entries into slot `dst` (which then has src's length)."""
        n = self.lengths[src]
        self._reserve(n, dst + 1)
        self._k[dst, :, :n] = self._k[src, :, :n]
        self._v[dst, :, :n] = self._v[src, :, :n]
        self.lengths[dst] = n

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove < 0 and self.is_initialized:
            lo, hi = self._span()
            for s in range(lo, hi):
                self.lengths[s] = max(0, self.lengths[s] + tokens_to_remove)
            self._views(self.length)


class KVCache(Cache):
    """A transformers Cache whose layers are GrowableLayer (one per model layer, created lazily).
    `slots`: requests it can hold (None: one per batch row of the first pass)."""

    def __init__(self, key_align: int = 1, slots: int | None = None) -> None:
        if key_align < 1:
            raise ValueError(f"key_align must be >= 1, got {key_align}")
        if slots is not None and slots < 1:
            raise ValueError(f"a cache needs at least one slot, got {slots}")
        self.selection = Selection(slots)
        super().__init__(layer_class_to_replicate=functools.partial(GrowableLayer, key_align, self.selection))
        self.key_align = key_align

    @property
    def slots(self) -> int | None:
        return self.selection.slots

    def select(self, lo: int, hi: int) -> None:
        """Run the next passes over slots lo .. hi-1."""
        if self.slots is not None and not 0 <= lo < hi <= self.slots:
            raise ValueError(f"slots {lo}..{hi - 1} are outside this cache's {self.slots}")
        self.selection.lo, self.selection.hi = lo, hi

    def place(self, offsets: list[torch.Tensor] | None) -> None:
        """Write the next passes' new entries of selected slot b at offsets[b] [Q] (distinct, counted from
        the slot's length) instead of in order; None: in order again."""
        sel = self.selection
        sel.offsets = offsets
        sel.spans = [int(o.max()) + 1 if o.numel() else 0 for o in offsets] if offsets is not None else []
        sel.at = [n + o for n, o in zip(self.slot_lengths(), offsets)] if offsets is not None else []

    def slot_lengths(self) -> list[int]:
        """The selected slots' lengths."""
        if not self.layers or not self.layers[0].is_initialized:
            lo, hi = self.selection.lo, self.selection.hi
            return [0] * ((hi if hi is not None else (self.slots or 1)) - lo)
        lo, hi = self.layers[0]._span()
        return self.layers[0].lengths[lo:hi]

    def key_width(self, new: int | Sequence[int]) -> int:
        """How many keys the model sees after the next pass (what `update` hands it: the longest slot's new
        length padded to key_align). `new`: the entries each selected slot will span (one count for all,
        or one per slot: with placed entries, a slot spans its largest offset + 1)."""
        lengths = self.slot_lengths()
        spans = [new] * len(lengths) if isinstance(new, int) else list(new)
        end = max(n + w for n, w in zip(lengths, spans, strict=True))  # one span per selected slot
        return -(-end // self.key_align) * self.key_align

    def keep(self, prefix: int, rows: torch.Tensor, slot: int | None = None) -> None:
        """After a step that appended Q entries to a slot of length `prefix`, keep only `rows` of them
        (`slot`: which one; None: every selected slot, all of length prefix + Q)."""
        n = rows.numel()
        if n and int(rows[-1]) == n - 1:  # rows 0..n-1 (ascending, distinct): already in place, no copy
            if slot is None:
                for layer in self.layers:
                    layer.crop(prefix + n - layer.length)
            else:
                self._set_lengths(range(slot, slot + 1), prefix + n)
            return
        kern = exact_kernel.loaded()
        if kern is not None and n and rows.dtype == torch.long and all(layer.is_initialized for layer in self.layers):
            # every layer's keys and values in one call (engine/lean_kernel.cpp), then the lengths
            lo, hi = self.layers[0]._span() if slot is None else (slot, slot + 1)
            kern.keep_rows_([t for layer in self.layers for t in (layer._k, layer._v)], lo, hi, prefix, rows)
            self._set_lengths(range(lo, hi), prefix + n)
            return
        for layer in self.layers:
            layer.keep(prefix, rows, slot)

    def _set_lengths(self, slots: range, length: int) -> None:
        """Slots `slots` hold `length` entries in every layer (the layers' lengths move together: one
        layer's longest selected slot is every layer's). A step sets them once per pass, for ~30 layers."""
        for layer in self.layers:
            for s in slots:
                layer.lengths[s] = length
        end = self.layers[0].length if self.layers else 0
        for layer in self.layers:
            layer._views(end)

    def move(self, src: int, dst: int) -> None:
        """Slot `dst` takes over slot `src`'s entries (the scheduler packs its active requests)."""
        for layer in self.layers:
            if layer.is_initialized:
                layer.move(src, dst)

    def prefix(self, slot: int, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Copies of slot `slot`'s first n keys and values, per layer: [H, n, D] each."""
        return [(layer._k[slot, :, :n].clone(), layer._v[slot, :, :n].clone()) for layer in self.layers]

    def load(self, slot: int, prefix: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Slot `slot` holds exactly `prefix` (per layer keys, values [H, n, D], as `prefix` gave them), and
        the next pass appends after it."""
        while len(self.layers) < len(prefix):
            self.layers.append(self.layer_class_to_replicate())
        for layer, (keys, values) in zip(self.layers, prefix):
            layer.load(slot, keys, values)

    def clear(self, slot: int) -> None:
        for layer in self.layers:
            if layer.is_initialized:
                layer.set_length(slot, 0)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.layers[layer_idx].get_seq_length() if self.layers else 0
