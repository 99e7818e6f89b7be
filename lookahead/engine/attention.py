"""An attention function whose row results do not depend on how many keys or rows share the pass.

Registered through transformers' public AttentionInterface and selected on the model by `install`.
Outside the engine's exact passes it simply calls transformers' own SDPA attention, so the model
behaves as before for everybody else (transformers' generate() included).

Why it exists (measured on SmolLM2-135M in bfloat16, 2-core Zen 4): PyTorch's fused CPU attention picks
its blocking and packing by problem size, so the same row over the same visible keys came out
different (up to 0.44 in the logits) when the pass had more keys, e.g. an autoregressive step at
position s (s + 8 keys) and a lookahead step whose chain reaches s (p + 10 keys). Written as two
matmuls and a float32 softmax, with the key count padded to a multiple of 64 by the cache
(engine/kvcache.py), a row's result depends only on its own visible keys: bit-identical across widths
and contexts (tests/engine/test_numerics.py; engine/numerics.py probes it per model).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import torch

NAME = "lookahead_exact"
_active: contextvars.ContextVar[bool] = contextvars.ContextVar("lookahead_exact_attention", default=False)
_registered = False


def exact_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                    **kwargs: Any) -> tuple[torch.Tensor, None]:
    """query [B, H, Q, D]; key/value [B, Hkv, K, D]; attention_mask [B, 1, Q, >=K] additive.
    Returns ([B, Q, H, D], None) as transformers' attention functions do."""
    if not _active.get():
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    b, h, q, d = query.shape
    kv_heads, k = key.shape[1], key.shape[2]
    groups = h // kv_heads  # grouped-query attention: query heads kv*groups .. kv*groups+groups-1 share kv head kv
    query = query.reshape(b, kv_heads, groups * q, d)  # [B, Hkv, G*Q, D]: no copy of the keys
    scale = scaling if scaling is not None else d ** -0.5
    acc = torch.promote_types(query.dtype, torch.float32)  # softmax in float32 at least (float64 stays)
    scores = torch.matmul(query, key.transpose(-1, -2)).to(acc) * scale  # [B, Hkv, G*Q, K]
    if attention_mask is not None:
        mask = attention_mask[..., :k].to(acc)  # [B, 1, Q, K]
        scores = (scores.view(b, kv_heads, groups, q, k) + mask[:, :, None]).view(b, kv_heads, groups * q, k)
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    out = torch.matmul(probs, value).view(b, h, q, d)  # [B, H, Q, D]
    return out.transpose(1, 2).contiguous(), None


@contextlib.contextmanager
def exact_passes() -> Iterator[None]:
    """Within this block, models that `install` selected compute attention with `exact_attention`."""
    token = _active.set(True)
    try:
        yield
    finally:
        _active.reset(token)


def install(model: Any) -> bool:
    """Select the exact attention on `model` where it is a drop-in replacement (plain softmax attention:
    no logit soft-capping, no attention sinks). Returns whether it is in place."""
    global _registered
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if getattr(config, "_attn_implementation", None) == NAME:
        return True
    if getattr(config, "attn_logit_softcapping", None) or getattr(config, "use_sinks", False):
        return False
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return False  # the user chose another kernel (eager, flash, flex, ...): leave it
    if not hasattr(model, "set_attn_implementation"):
        return False
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionInterface.register(NAME, exact_attention)
        AttentionMaskInterface.register(NAME, sdpa_mask)  # models build SDPA's masks for it when we pass none
        _registered = True
    try:
        model.set_attn_implementation(NAME)
    except (ValueError, NotImplementedError, AttributeError):
        return False
    return True
