"""A KV cache that grows in place and can keep an arbitrary subset of a step's new entries.

transformers' DynamicLayer concatenates on every update (a full copy of the cache per step). This
layer keeps a preallocated buffer per layer, writes new keys/values in place, and returns views.
Every layer keeps all keys (no sliding-window eviction): sliding windows are enforced in the mask,
because a step's speculative tokens would otherwise evict keys that the accepted prefix still needs.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer


class GrowableLayer(DynamicLayer):
    """keys/values: views [B, H, length, D] into buffers [B, H, capacity, D]."""

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
        self._reserve(self.length + n)
        self._k[..., self.length : self.length + n, :] = key_states
        self._v[..., self.length : self.length + n, :] = value_states
        self.length += n
        self.keys = self._k[..., : self.length, :]
        self.values = self._v[..., : self.length, :]
        return self.keys, self.values

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

    def __init__(self) -> None:
        super().__init__(layer_class_to_replicate=GrowableLayer)

    def keep(self, prefix: int, rows: torch.Tensor) -> None:
        """After a step that appended Q entries to a cache of `prefix`, keep only `rows` of them."""
        for layer in self.layers:
            layer.keep(prefix, rows)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.layers[layer_idx].get_seq_length() if self.layers else 0
