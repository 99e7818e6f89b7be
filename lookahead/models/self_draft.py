"""A self-draft: the target's first L decoder layers, then its final norm and LM head.

No weights are copied: the wrapper holds references to the target's own embedding, first L layers,
final norm, rotary embedding and LM head, and runs them the way the model's own forward does. It
takes the same call as a causal LM (input_ids, position_ids, a 4-D attention mask or a dict of them
per layer type, a cache, logits_to_keep), so the engine's StepRunner drives it like any model. It has
its own KV cache (L layers), separate from the target's.
"""

from __future__ import annotations

from typing import Any

import torch

from lookahead.errors import ConfigError
from lookahead.models.lean import LeanDecoder, LeanOutput

# Decoder-only families whose model.forward is: embed -> rotary(hidden, position_ids) -> layers(hidden,
# attention_mask, position_embeddings, position_ids, cache, use_cache) -> norm -> lm_head.
SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")


class SelfDraft(torch.nn.Module):
    def __init__(self, target: Any, layers: int) -> None:
        super().__init__()
        model_type = getattr(target.config, "model_type", "?")
        base = getattr(target, "model", None)
        parts = ("embed_tokens", "layers", "norm", "rotary_emb")
        if model_type not in SUPPORTED or base is None or not all(hasattr(base, p) for p in parts):
            raise ConfigError(
                f"self-drafting supports llama-like models ({', '.join(SUPPORTED)}), not {model_type!r}; "
                "pass a separate draft model that shares the tokenizer (--draft MODEL) or use another strategy"
            )
        total = len(base.layers)
        if not 1 <= layers <= total:
            raise ConfigError(f"self:{layers} asks for {layers} layers but the target has {total}; pick L in 1..{max(1, total - 1)}")
        self.config = target.config
        self.embed_tokens = base.embed_tokens
        self.layers = torch.nn.ModuleList(list(base.layers[:layers]))
        self.norm = base.norm
        self.rotary_emb = base.rotary_emb
        self.lm_head = target.get_output_embeddings()
        self.eval()
        # the model's own forward over these layers; Llama layers without its per-call machinery (lean.py)
        self._run = LeanDecoder(target, list(self.layers))

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.lm_head

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | dict[str, torch.Tensor],
        cache: Any = None,
        use_cache: bool = True,
        logits_to_keep: int | torch.Tensor = 0,
    ) -> LeanOutput:
        return self._run(input_ids, position_ids, attention_mask, cache, use_cache, logits_to_keep)
