"""4-D additive attention masks for one decoding step, built from positions and a local visibility matrix.

The model's own mask builder is skipped when a 4-D mask is passed, so sliding windows must be
enforced here. Models that mix layer types (Gemma 3, Qwen2/3 with `layer_types`) take a dict
{layer_type: mask}; the others take one tensor (with the window applied if `sliding_window` is set
for every layer, as in Mistral).
"""

from __future__ import annotations

from typing import Any

import torch


class MaskBuilder:
    def __init__(self, config: Any, dtype: torch.dtype) -> None:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        window = getattr(text, "sliding_window", None)
        layer_types = getattr(text, "layer_types", None)
        self.layer_types: list[str] = list(layer_types or [])
        self.dtype = dtype
        self.min = torch.finfo(dtype).min
        # kind name -> window (None means full attention); `as_dict` says how the model takes them.
        if layer_types:
            self.as_dict = True
            self.kinds = {t: (window if t == "sliding_attention" else None) for t in dict.fromkeys(layer_types)}
            unknown = set(self.kinds) - {"full_attention", "sliding_attention"}
            if unknown:
                raise NotImplementedError(f"attention layer types {sorted(unknown)} are not supported yet")
        else:
            self.as_dict = False
            self.kinds = {"full_attention": window if isinstance(window, int) and window > 0 else None}

    def window(self, layer: int) -> int | None:
        """Layer `layer`'s sliding window (None: full attention), as the masks built here apply it."""
        return self.kinds[self.layer_types[layer]] if self.as_dict else self.kinds["full_attention"]

    def build(self, prefix: int, positions: torch.Tensor, local: torch.Tensor,
              width: int | None = None, offsets: torch.Tensor | None = None,
              dtype: torch.dtype | None = None) -> torch.Tensor | dict[str, torch.Tensor]:
        """Mask for Q query tokens over `prefix` cached keys (positions 0..prefix-1) plus the Q new keys.

        positions: [Q] absolute positions of the query tokens; local: [Q, Q] bool, local[i, j] says
        query i may see new key j; offsets: [Q] distinct, where new key j sits after the prefix (None:
        0..Q-1; the keys between are masked for everyone); width: total keys the model sees (>= prefix +
        span; keys past it are alignment padding, masked for everyone); dtype: the masks' dtype (None:
        the model's; the masked value is the model's dtype's minimum either way). Returns [1, 1, Q, width]
        additive masks (0 visible, min elsewhere).
        """
        q = positions.shape[0]
        span = q if offsets is None else int(offsets.max()) + 1
        total = width or prefix + span
        visible = torch.zeros(q, total, dtype=torch.bool)  # [Q, K]
        visible[:, :prefix] = True
        new = slice(prefix, prefix + q) if offsets is None else prefix + offsets  # [Q] key columns
        visible[:, new] = local
        key_pos = None
        if any(window is not None for window in self.kinds.values()):
            far = -(2**40)  # masked keys sit "far away" (outside every window)
            key_pos = positions.new_full((total,), far)  # [K]
            key_pos[:prefix] = torch.arange(prefix, dtype=positions.dtype)
            key_pos[new] = positions
        masks: dict[str, torch.Tensor] = {}
        for kind, window in self.kinds.items():
            vis = visible
            if window is not None and key_pos is not None:
                vis = vis & ((positions[:, None] - key_pos[None, :]) < window)
            m = torch.zeros(q, total, dtype=dtype or self.dtype).masked_fill_(~vis, self.min)
            masks[kind] = m[None, None]
        return masks if self.as_dict else masks["full_attention"]
