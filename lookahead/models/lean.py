"""A decoder's forward pass without the framework's per-call machinery, for the layers it knows.

A decoding pass of a small model on a CPU is mostly not arithmetic. SmolLM2-135M (bfloat16, 2 Zen 4
cores) streams its 212 MB of linear weights in ~4-7 ms, yet a one-row pass took ~20-28 ms: ~3,000
tensor operations of a few microseconds each (norms, rotary, casts, views) and, around them,
transformers' Python for each of 30 layers, their attention and their MLP (keyword plumbing,
decorators, deprecation shims, the attention lookup, output dataclasses). This module runs the same
tensor operations in the same order, so every logit keeps its bits, and skips the machinery:

    embed -> rotary(positions) -> for each layer:
        h = h + o_proj(attention(rotary(q, k), cache.update(k, v), mask))      (q, k, v from norm(h))
        h = h + down_proj(act(gate_proj(norm(h))) * up_proj(norm(h)))
    -> final norm -> LM head on the kept rows

Only layers whose classes are exactly transformers' Llama classes (SmolLM2, Llama, and other
checkpoints that load as them) take the lean path, and only under an attention implementation whose
function takes nothing beyond what is passed here (SDPA, eager, the engine's exact attention). Any
other layer is called as its module, with the arguments the model's own forward gives it, so a family
this module does not know runs exactly as before. Modules with hooks are called as modules too; the
final norm always is (the engine reads hidden states off it with a hook). In bfloat16 on CPU, each
layer's rotary embedding and its two norms run on lookahead's kernel (engine/lean_kernel.cpp), which
repeats PyTorch's rounding element by element, the norms' variance summed in PyTorch's own order
(`norm_lanes`).

Measured (SmolLM2-135M, bfloat16, 2 Zen 4 cores, passes over 256 cached keys, interleaved):
docs/measurements.md, "Measured: a lean forward pass". LOOKAHEAD_LEAN_FORWARD=0 runs the model's own forward.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from lookahead.engine import exact_kernel
from lookahead.models.packing import group_runner

ENV = "LOOKAHEAD_LEAN_FORWARD"
# attention implementations whose functions need no keyword beyond mask, dropout and scaling
PLAIN_ATTENTION = ("sdpa", "eager", "lookahead_exact")


@dataclass
class LeanOutput:
    logits: torch.Tensor  # [B, R, V]


def enabled(env: str = ENV) -> bool:
    """The lean path is on unless the environment variable is "0"."""
    return os.environ.get(env, "1") != "0"


def _llama_classes() -> tuple[type, ...]:
    from transformers.models.llama import modeling_llama as m

    return m.LlamaDecoderLayer, m.LlamaAttention, m.LlamaMLP, m.LlamaRMSNorm


def _hooked(module: torch.nn.Module) -> bool:
    return any(bool(m._forward_hooks or m._forward_pre_hooks) for m in module.modules())


def lean_layer(layer: Any) -> bool:
    """Is `layer` one the lean path computes exactly as its own forward does (a Llama decoder layer
    of stock classes, no hooks, not training)?"""
    decoder, attention, mlp, norm = _llama_classes()
    return (type(layer) is decoder and type(layer.self_attn) is attention and type(layer.mlp) is mlp
            and type(layer.input_layernorm) is norm and type(layer.post_attention_layernorm) is norm
            and not layer.training and not _hooked(layer))


def _hooked_top(model: Any) -> bool:
    """Hooks on the model or its decoder themselves (not on their children, which `lean_layer` checks):
    the model's own forward would run them."""
    return any(bool(m._forward_hooks or m._forward_pre_hooks) for m in (model, model.model))


def _rms_norm(norm: Any, h: torch.Tensor) -> torch.Tensor:
    """LlamaRMSNorm's forward, op for op: float32 variance, scaled, cast back, times the weight."""
    x = h.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * x.to(h.dtype)


def _rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' apply_rotary_pos_emb for one tensor [B, H, Q, D] (cos/sin [B, 1, Q, D])."""
    half = x.shape[-1] // 2
    return (x * cos) + (torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin)


class _LlamaParts(NamedTuple):
    """A Llama layer's parts, looked up once (nn.Module attribute lookups cost ~1 us each, ten a layer a
    pass) and called through their `forward` (skipping nn.Module's call machinery: a lean layer has no
    hooks)."""

    norm1: Any
    q: Callable[[torch.Tensor], torch.Tensor]
    k: Callable[[torch.Tensor], torch.Tensor]
    v: Callable[[torch.Tensor], torch.Tensor]
    o: Callable[[torch.Tensor], torch.Tensor]
    norm2: Any
    gate: Callable[[torch.Tensor], torch.Tensor]
    up: Callable[[torch.Tensor], torch.Tensor]
    down: Callable[[torch.Tensor], torch.Tensor]
    act: Callable[[torch.Tensor], torch.Tensor]
    qkv: Callable[[torch.Tensor], Sequence[torch.Tensor]] | None  # q, k and v in one call where stacked (packing)
    gate_up: Callable[[torch.Tensor], Sequence[torch.Tensor]] | None  # gate and up likewise
    attn: Any  # the attention module, as the attention function takes it
    index: int  # its layer index in the cache
    head_dim: int
    scaling: float


def _llama_parts(layer: Any) -> _LlamaParts:
    a, m = layer.self_attn, layer.mlp
    return _LlamaParts(layer.input_layernorm, a.q_proj.forward, a.k_proj.forward, a.v_proj.forward, a.o_proj.forward,
                       layer.post_attention_layernorm, m.gate_proj.forward, m.up_proj.forward, m.down_proj.forward,
                       m.act_fn.forward, group_runner([a.q_proj, a.k_proj, a.v_proj]),
                       group_runner([m.gate_proj, m.up_proj]), a, a.layer_idx, a.head_dim, a.scaling)


def _norm_on_kernel(kern: Any, norm: Any, h: torch.Tensor, lanes: int) -> torch.Tensor:
    """_rms_norm in one kernel call (engine/lean_kernel.cpp) where `lanes` > 0 (the kernel adds the
    variance's terms in PyTorch's order for vectors of that many lanes), else everything after the
    variance in one call."""
    if lanes:
        return kern.rms_norm(h, norm.weight, norm.variance_epsilon, lanes)
    return kern.rms_scale(h, h.to(torch.float32).pow(2).mean(-1, keepdim=True), norm.weight, norm.variance_epsilon)


LANES = (8, 16, 4)  # vector widths PyTorch's CPU sums may use (AVX2 and the default build, AVX-512, ...)
_NORM_LANES: dict[int, int] = {}  # row width -> lanes for which the kernel's whole norm is PyTorch's (0: none)


def norm_lanes(kern: Any, width: int) -> int:
    """The vector width (lanes, LANES tried in turn) with which the kernel sums a norm's variance as this
    PyTorch build does on rows of `width`: its float32 variance compared bit for bit with
    x.float().pow(2).mean(-1) on random rows across bfloat16's range, once per width and process; 0
    where none matches (then the variance stays PyTorch's and only the rest of the norm runs on the
    kernel). PyTorch 2.13's sum runs 8-lane vectors on this Zen 4, AVX-512 or not."""
    if width not in _NORM_LANES:
        g = torch.Generator().manual_seed(width)
        rows = (torch.randn(256, width, generator=g) * torch.logspace(-6, 6, 256)[:, None]).to(torch.bfloat16)
        want = rows.to(torch.float32).pow(2).mean(-1, keepdim=True)
        _NORM_LANES[width] = next((lanes for lanes in LANES if width >= lanes and torch.equal(kern.variance(rows, lanes), want)), 0)
    return _NORM_LANES[width]


def _llama_layer(p: _LlamaParts, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: Any, cache: Any,
                 attend: Callable[..., tuple[torch.Tensor, Any]], kern: Any, lanes: int) -> torch.Tensor:
    """One LlamaDecoderLayer on h [B, Q, D]: the same operations as its forward, in the same order (with
    `kern`, bfloat16: the rotary embedding and each norm in one call, same bits; `lanes`: see norm_lanes).
    cos/sin: [B, Q, hd] with `kern`, else [B, 1, Q, hd] (broadcast over heads)."""
    b, q = h.shape[:2]
    heads = (b, q, -1, p.head_dim)
    x = _rms_norm(p.norm1, h) if kern is None else _norm_on_kernel(kern, p.norm1, h, lanes)
    qx, kx, vx = p.qkv(x) if p.qkv is not None else (p.q(x), p.k(x), p.v(x))  # [B, Q, H*hd], [B, Q, Hkv*hd] x2
    if kern is not None:
        query, key = kern.rotary_qk(qx, kx, cos, sin, p.head_dim)  # [B, H, Q, hd], [B, Hkv, Q, hd]
    else:
        query = _rotary(qx.view(heads).transpose(1, 2), cos, sin)  # [B, H, Q, hd]
        key = _rotary(kx.view(heads).transpose(1, 2), cos, sin)  # [B, Hkv, Q, hd]
    value = vx.view(heads).transpose(1, 2)  # [B, Hkv, Q, hd]
    if cache is not None:
        key, value = cache.update(key, value, p.index)  # [B, Hkv, K, hd]
    out, _ = attend(p.attn, query, key, value, mask, dropout=0.0, scaling=p.scaling)  # [B, Q, H, hd]
    h = h + p.o(out.reshape(b, q, -1).contiguous())
    x = _rms_norm(p.norm2, h) if kern is None else _norm_on_kernel(kern, p.norm2, h, lanes)
    gate, up = p.gate_up(x) if p.gate_up is not None else (p.gate(x), p.up(x))  # [B, Q, I] each
    return h + p.down(p.act(gate) * up)


class LeanDecoder:
    """Runs `layers` of a decoder-only causal LM (embedding, rotary embedding, final norm and LM head
    are the model's own modules) with the same call as the model: input_ids/position_ids [B, Q], a 4-D
    mask (or a dict of them by layer type), the cache, logits_to_keep (row indices or a count from the
    end; 0: every row). Layers `lean_layer` accepts run lean, the rest as modules."""

    def __init__(self, model: Any, layers: Sequence[Any] | None = None) -> None:
        base = model.model
        self.config = model.config
        self.embed_tokens, self.rotary_emb, self.norm = base.embed_tokens, base.rotary_emb, base.norm
        self.lm_head = model.get_output_embeddings()
        self.layers = list(base.layers[: model.config.num_hidden_layers] if layers is None else layers)
        types = getattr(model.config, "layer_types", None)
        self.layer_types: list[str] = list(types[: len(self.layers)]) if types else ["full_attention"] * len(self.layers)
        impl = getattr(model.config, "_attn_implementation", None)
        plain = impl in PLAIN_ATTENTION
        self.lean = [plain and lean_layer(layer) for layer in self.layers]
        self._parts = [_llama_parts(layer) if lean else None for layer, lean in zip(self.layers, self.lean)]
        # bfloat16 weights on CPU: rotary and norms on lookahead's kernel where it builds (never built for a GPU)
        weight = self.embed_tokens.weight
        self._kernel_parts = weight.device.type == "cpu" and all(
            p is None or p.norm1.weight.dtype == p.norm2.weight.dtype == torch.bfloat16 for p in self._parts
        ) and exact_kernel.lean_parts(weight.dtype)
        kern = exact_kernel.kernel() if self._kernel_parts else None
        self._lanes = norm_lanes(kern, int(weight.shape[-1])) if kern is not None else 0

    @property
    def lean_layers(self) -> int:
        """How many layers take the lean path."""
        return sum(self.lean)

    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: Any,
                 cache: Any = None, use_cache: bool = True, logits_to_keep: int | torch.Tensor = 0,
                 past_key_values: Any = None) -> LeanOutput:
        cache = cache if cache is not None else past_key_values  # the keyword's older name
        hidden = self.embed_tokens(input_ids)  # [B, Q, D]
        cos, sin = self.rotary_emb(hidden, position_ids)  # [B, Q, hd] each
        attend = None
        if any(self.lean):
            from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
            from transformers.models.llama.modeling_llama import eager_attention_forward

            attend = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        kern = exact_kernel.kernel() if self._kernel_parts and hidden.device.type == "cpu" else None
        rot = (cos, sin) if kern is not None else (cos.unsqueeze(1), sin.unsqueeze(1))  # see _llama_layer
        for layer, kind, parts in zip(self.layers, self.layer_types, self._parts):
            mask = attention_mask[kind] if isinstance(attention_mask, dict) else attention_mask
            if parts is not None:
                hidden = _llama_layer(parts, hidden, *rot, mask, cache, attend, kern, self._lanes)
            else:
                hidden = layer(hidden, attention_mask=mask, position_embeddings=(cos, sin),
                               position_ids=position_ids, cache=cache, use_cache=use_cache)
        hidden = self.norm(hidden)  # every row, as the model's forward norms them (hooks on it see them all)
        if isinstance(logits_to_keep, torch.Tensor):  # row indices, as transformers' models take them
            hidden = hidden[:, logits_to_keep]
        elif logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        return LeanOutput(logits=self.lm_head(hidden))


def lean_decoder(model: Any) -> LeanDecoder | None:
    """A LeanDecoder for `model` where it is transformers' own LlamaForCausalLM (whose forward
    LeanDecoder's is), one of its layers would take the lean path and the environment allows it (ENV);
    None otherwise: run the model's own forward."""
    if not enabled() or getattr(model, "training", False):
        return None
    from transformers.models.llama.modeling_llama import LlamaForCausalLM, LlamaModel

    if type(model) is not LlamaForCausalLM or type(model.model) is not LlamaModel or _hooked_top(model):
        return None
    decoder = LeanDecoder(model)
    return decoder if decoder.lean_layers else None
