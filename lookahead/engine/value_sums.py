"""Value sums of the exact attention (engine/attention.py): probabilities times values summed over keys in
fixed chunks, and the widest chunk this device sums the same way at every key count and row count.

A row's weighted sum must not depend on how many keys or rows share its pass (engine/numerics.py checks
the whole model). Keys are padded to KEY_ALIGN and summed one chunk per matmul, the chunks added in
order; `key_chunk` measures, once per process, the widest of KEY_CHUNKS for which that holds.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from lookahead.engine import exact_kernel

# Exact passes see their keys padded to a multiple of KEY_ALIGN (engine/kvcache.py), and values are summed
# over keys in chunks of a multiple of it (`weighted_sum`): whole chunks, so that nothing is padded per
# layer (measured, SmolLM2 bf16, 2-core Zen 4, three a-f prompts, 96 tokens, median ms/token:
# autoregressive 45.2 -> 42.9, lookahead 19.5 -> 17.0 against padding to 64; the same tokens). Masked keys
# cost a few more score columns.
KEY_ALIGN = 256
# How many keys one matmul of probabilities and values may sum: the widest of KEY_CHUNKS whose sums the
# device's kernels take the same way at every key count and row count (`key_chunk` measures it, per
# dtype and head shape). One matmul over 512 keys costs half of two over 256 plus their sum (SmolLM2 bf16,
# Zen 4: 32 against 69 us a layer).
KEY_CHUNKS = (1024, 512, KEY_ALIGN)
KEY_CHUNK = KEY_ALIGN  # the narrowest chunk: exact on every device measured (the default where none is probed)


def weighted_sum(probs: torch.Tensor, value: torch.Tensor, chunk: int = KEY_CHUNK) -> torch.Tensor:
    """probs [..., R, K] @ value [..., K, D]: keys padded with exact zeros to a multiple of KEY_ALIGN, the
    keys summed in chunks of `chunk` (a multiple of KEY_ALIGN; the last chunk may be shorter), each chunk a
    matmul of its own (the whole chunks in one batched call), the chunks summed in order in float32 at
    least. Over one chunk's keys every row's sum is then one matmul whatever the pass's key count, and
    chunks past a row's keys add exact zeros; `key_chunk` picks the widest chunk for which such matmuls
    sum a row's keys the same way at every key count and row count.

    Why (measured): a matmul's reduction over keys is not fixed by the keys alone. Zen 4 (bfloat16): one
    matmul over more than 1024 keys reduced them in another order than one over fewer, so a prompt near
    1024 tokens decoded differently with lookahead; float32 (MKL) reduced 200 visible keys differently at
    256 or 320 keys than at >= 384. Xeon with AMX (bfloat16, 2 threads): a matmul over 512-1088 keys
    reduced them differently when it had 33-48 rows (query rows x grouped heads) than alone, so a
    width-16 lookahead step gave other logits than autoregressive decoding; over <= 384 keys every row
    count 1-64 agreed, in both dtypes, for the head shapes of SmolLM2 and Gemma 3."""
    k = probs.shape[-1]
    pad = -k % KEY_ALIGN
    if pad:
        probs, value = F.pad(probs, (0, pad)), F.pad(value, (0, 0, 0, pad))
        k += pad
    if k <= chunk:
        return torch.matmul(probs, value)
    *lead, r, _ = probs.shape
    whole, tail = divmod(k, chunk)
    body = k - tail
    parts = torch.matmul(probs[..., :body].reshape(*lead, r, whole, chunk).transpose(-3, -2),  # [..., C, R, chunk]
                         value[..., :body, :].reshape(*lead, whole, chunk, value.shape[-1]))  # [..., C, R, D]
    out = torch.empty((*lead, r, value.shape[-1]), dtype=torch.promote_types(value.dtype, torch.float32))
    out.copy_(parts[..., 0, :, :])  # [..., R, D], contiguous: a new tensor, never a view of `parts`
    for i in range(1, whole):
        out += parts[..., i, :, :]
    if tail:
        out += torch.matmul(probs[..., body:], value[..., body:, :])
    return out.to(value.dtype)


def weighted(probs: torch.Tensor, value: torch.Tensor, chunk: int) -> torch.Tensor:
    """probs [..., R, K] (float32 at least) @ value [..., K, D] as the pass's main rows are summed: by the
    kernel where it serves value's dtype (probabilities kept in float32), else `weighted_sum` of the
    probabilities rounded to value's dtype. probs and value have two leading dims."""
    if exact_kernel.serves(value.dtype, value.shape[-1]):
        return exact_kernel.kernel().weighted(probs.contiguous(), value)
    return weighted_sum(probs.to(value.dtype), value, chunk)


def key_chunk(dtype: torch.dtype, kv_heads: int, groups: int, head_dim: int) -> int:
    """The widest of KEY_CHUNKS for which `weighted_sum` gives a row the same result over any key count
    (multiples of KEY_ALIGN, past its visible keys) and any number of rows sharing the matmul, on this
    device, in `dtype`, for this head shape; measured once per process and thread count. The engine's
    width probe (engine/numerics.py) then checks the whole model with it."""
    key = (dtype, kv_heads, groups, head_dim, torch.get_num_threads())
    if key not in _chunks:
        _chunks[key] = next((c for c in KEY_CHUNKS[:-1] if _sums_invariant(c, *key[:4])), KEY_CHUNKS[-1])
    return _chunks[key]


_chunks: dict[tuple[Any, ...], int] = {}


def head_shape(model: Any) -> tuple[int, int, int] | None:
    """(key/value heads, query heads per kv head, head size) from `model`'s config; None where it does
    not say."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or (config.hidden_size // heads if heads else None)
    if not heads or not head_dim or heads % kv_heads:
        return None
    return kv_heads, heads // kv_heads, head_dim


def model_key_chunk(model: Any) -> int:
    """`key_chunk` for `model`'s attention heads and dtype (KEY_CHUNK where its config does not say)."""
    shape = head_shape(model)
    return key_chunk(next(model.parameters()).dtype, *shape) if shape else KEY_CHUNK


def _sums_invariant(chunk: int, dtype: torch.dtype, kv_heads: int, groups: int, head_dim: int) -> bool:
    """Does one row's weighted sum come out bit-identical in passes of 1-48 query rows over 1 .. 2 chunks
    and a tail of keys? The row sees `visible` keys (some end inside a chunk, some just past one)."""
    gen = torch.Generator().manual_seed(chunk)
    most = 2 * chunk + KEY_ALIGN
    value = torch.randn(kv_heads, most, head_dim, generator=gen).to(dtype)
    for visible in (KEY_ALIGN - 1, KEY_ALIGN + 44, chunk - 24, chunk + 3, chunk + KEY_ALIGN + 60):
        weights = torch.rand(kv_heads, groups, visible, generator=gen)
        row = (weights / weights.sum(-1, keepdim=True)).to(dtype)  # [Hkv, G, visible]
        first = -(-visible // KEY_ALIGN) * KEY_ALIGN
        ref = None
        for rows in (1, 2, 3, 4, 8, 11, 16, 17, 33, 48):
            for keys in range(first, min(most, first + chunk + KEY_ALIGN) + 1, KEY_ALIGN):
                probs = torch.rand(kv_heads, rows, groups, keys, generator=gen).to(dtype)
                probs[:, rows // 2, :, :visible] = row
                probs[:, rows // 2, :, visible:] = 0
                out = weighted_sum(probs.view(kv_heads, rows * groups, keys), value[:, :keys], chunk)
                out = out.view(kv_heads, rows, groups, head_dim)[:, rows // 2]
                if ref is None:
                    ref = out
                elif not torch.equal(ref, out):
                    return False
    return True
