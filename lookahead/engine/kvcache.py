"""A KV cache that grows in place and can keep an arbitrary subset of a step's new entries.

transformers' DynamicLayer concatenates on every update (a full copy of the cache per step). This
layer keeps a preallocated buffer per layer, writes new keys/values in place, and returns views.
Every layer keeps all keys (no sliding-window eviction): sliding windows are enforced in the mask,
because a step's speculative tokens would otherwise evict keys that the accepted prefix still needs.

Key alignment (`key_align`): attention kernels reduce over the keys in vector-wide chunks and add the
last `length % chunk` keys one by one, so the same visible keys can be summed in a different order
when the total key count differs (an autoregressive step and a lookahead step over the same position
have different key counts). With key_align = A, `update` hands the model keys and values padded with
zeros up to a multiple of A (masked for every query by the step's mask), so every visible key lands in
the same full chunk whatever the step's width. The cache's length stays the real one.
"""

from __future__ import annotations

import functools

import torch
from transformers.cache_utils import Cache, DynamicLayer


class GrowableLayer(DynamicLayer):
    """keys/values: views [B, H, length, D] into buffers [B, H, capacity, D]."""

    def __init__(self, key_align: int = 1) -> None:
        super().__init__()
        self.key_align = key_align

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.length = 0
        self._k = key_states.new_empty((*key_states.shape[:2], 0, key_states.shape[-1]))
        self._v = value_states.new_empty((*value_states.shape[:2], 0, value_states.shape[-1]))

    def _reserve(self, needed: int) -> None:
        if needed <= self._k.shape[-2]:
            return
        capacity = max(needed, 2 * self._k.shape[-2], 256)
        for name in ("_k", "_v"):
            old = getattr(self, name)
            new = old.new_empty((*old.shape[:2], capacity, old.shape[-1]))
            new[..., : self.length, :] = old[..., : self.length, :]
            setattr(self, name, new)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        end = self.length + n
        padded = -(-end // self.key_align) * self.key_align
        self._reserve(padded)
        self._k[..., self.length : end, :] = key_states
        self._v[..., self.length : end, :] = value_states
        self.length = end
        self.keys = self._k[..., :end, :]
        self.values = self._v[..., :end, :]
        if padded == end:
            return self.keys, self.values
        self._k[..., end:padded, :] = 0  # masked zeros: every query gives them weight exactly 0
        self._v[..., end:padded, :] = 0
        return self._k[..., :padded, :], self._v[..., :padded, :]

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def keep(self, prefix: int, rows: torch.Tensor) -> None:
        """Keep entries [0, prefix) plus entries prefix + rows (rows ascending), drop the rest."""
        n = rows.numel()
        if n:
            src = rows + prefix
            self._k[..., prefix : prefix + n, :] = self._k.index_select(-2, src)
            self._v[..., prefix : prefix + n, :] = self._v.index_select(-2, src)
        self.length = prefix + n
        self.keys = self._k[..., : self.length, :]
        self.values = self._v[..., : self.length, :]

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove < 0 and self.is_initialized:
            self.length = max(0, self.length + tokens_to_remove)
            self.keys = self._k[..., : self.length, :]
            self.values = self._v[..., : self.length, :]


class KVCache(Cache):
    """A transformers Cache whose layers are GrowableLayer (one per model layer, created lazily)."""

    def __init__(self, key_align: int = 1) -> None:
        if key_align < 1:
            raise ValueError(f"key_align must be >= 1, got {key_align}")
        super().__init__(layer_class_to_replicate=functools.partial(GrowableLayer, key_align))
        self.key_align = key_align

    def key_width(self, new: int) -> int:
        """How many keys the model sees after appending `new` entries (padded to key_align)."""
        end = self.get_seq_length() + new
        return -(-end // self.key_align) * self.key_align

    def keep(self, prefix: int, rows: torch.Tensor) -> None:
        """After a step that appended Q entries to a cache of `prefix`, keep only `rows` of them."""
        n = rows.numel()
        if n and int(rows[-1]) == n - 1:  # rows 0..n-1 (ascending, distinct): already in place, no copy
            self.crop(prefix + n - self.get_seq_length())
            return
        for layer in self.layers:
            layer.keep(prefix, rows)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.layers[layer_idx].get_seq_length() if self.layers else 0
