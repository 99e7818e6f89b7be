"""Tiny random models built in-process (no downloads), for tests and examples.

The tokenizer is byte-level (256 byte tokens + 3 specials) with a ChatML chat template, so prompts,
chat messages, stop strings and streaming all behave like a real model's, only the text is random.
"""

from __future__ import annotations

from typing import Any

import torch

from lookahead.models.loader import LoadedModel, wrap

ARCHS = ("llama", "qwen2", "qwen3", "mistral", "gpt2", "gemma3")
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for s in SPECIALS:
        vocab[s] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.add_special_tokens({"additional_special_tokens": SPECIALS})
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_config(arch: str, vocab_size: int, **overrides: Any) -> Any:
    """A 2-4 layer config of the given architecture, small enough for ~1 ms forwards."""
    from transformers import AutoConfig

    common = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    if arch == "gpt2":
        cfg = AutoConfig.for_model("gpt2", vocab_size=vocab_size, n_embd=64, n_layer=2, n_head=4, n_positions=1024,
                                   bos_token_id=0, eos_token_id=0)
    elif arch == "gemma3":
        cfg = AutoConfig.for_model("gemma3_text", **{**common, "num_hidden_layers": 4, "head_dim": 16,
                                   "sliding_window": 8, "layer_types": ["sliding_attention"] * 3 + ["full_attention"]})
    elif arch == "mistral":
        cfg = AutoConfig.for_model("mistral", **common, sliding_window=16)
    elif arch == "qwen3":
        cfg = AutoConfig.for_model("qwen3", **common, head_dim=16)
    elif arch in ("llama", "qwen2"):
        cfg = AutoConfig.for_model(arch, **common)
    else:
        raise ValueError(f"unknown tiny architecture {arch!r}; choose one of {', '.join(ARCHS)}")
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


def tiny_model(arch: str = "llama", *, dtype: torch.dtype = torch.float32, seed: int = 0, **overrides: Any) -> LoadedModel:
    """A randomly initialised model of `arch` with the byte tokenizer, deterministic in `seed`."""
    from transformers import AutoModelForCausalLM

    tokenizer = byte_tokenizer()
    cfg = tiny_config(arch, vocab_size=len(tokenizer), **overrides)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    cfg.eos_token_id = eos
    cfg.bos_token_id = tokenizer.convert_tokens_to_ids("<|im_start|>")
    cfg.pad_token_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    with torch.no_grad():  # larger weights give peaky, repetitive distributions: guesses then hit
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(3.0)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = cfg.pad_token_id
    model._lookahead_flat_costs = True  # its timings mean nothing: the engine assumes a flat cost curve
    # its aligned trees go by the probe's own checks, not by the CPU (engine/numerics.py): the equivalence
    # tests verify aligned trees on these models directly
    model._lookahead_probe_trees_only = True
    return wrap(model, tokenizer, name=f"tiny-{arch}")


def hold_steps_while(path: str, limit_s: float = 120.0) -> None:
    """In this process, make every decoding pass wait while the file `path` exists (at most `limit_s`).

    For tests that need requests certainly in flight (e.g. a Ray replica killed mid-request) without
    relying on timing: create the file, send requests (they are admitted, then wait before their first
    pass), do what the test needs, delete the file. Run it in the serving process, e.g. as a
    cluster ReplicaSpec's `setup` (functools.partial(hold_steps_while, path))."""
    import os
    import time

    from lookahead.scheduler.scheduler import Scheduler

    step = Scheduler.step

    def held(self: Scheduler) -> Any:
        end = time.monotonic() + limit_s
        while os.path.exists(path) and time.monotonic() < end:
            time.sleep(0.01)
        return step(self)

    Scheduler.step = held  # type: ignore[method-assign]
