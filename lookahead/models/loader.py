"""load(): resolve a model name or path, load it through public transformers APIs, cache conversions."""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from lookahead.errors import ModelNotFoundError, PromptError
from lookahead.models import dtypes
from lookahead.models.packing import PACKING_VERSION, pack_linears
from lookahead.models.registry import EMBEDDED, cache_root

Messages = Sequence[dict[str, str]]
PromptLike = str | Messages | Sequence[int]


def plain_transcript(messages: Messages) -> str:
    """Chat messages as plain text, for a model whose tokenizer has no chat template (a base model, such as
    the embedded gemma3-270m): each message as "Role: content" (roles capitalised), messages separated by a
    blank line, ending with "Assistant:" for the model to continue. transformers refuses to guess a
    template; a base model has none to follow, so this is the transcript it is most likely to continue.
    Nothing stops the model at the next "User:": pass a stop string for that."""
    turns = [f"{m['role'].strip().capitalize()}: {m['content']}" for m in messages]
    return "\n\n".join([*turns, "Assistant:"])


@dataclass(frozen=True)
class LoadedModel:
    """A causal LM, its tokenizer, and the facts the engine needs about them."""

    name: str
    model: Any  # transformers PreTrainedModel (AutoModelForCausalLM)
    tokenizer: Any  # transformers tokenizer with a chat template
    eos_token_ids: tuple[int, ...]
    context_length: int
    dtype: torch.dtype
    packed: int = 0  # linear layers running on weights packed once (models/packing.py)

    @property
    def timing_key(self) -> str:
        """What the device's measured timings (cost curves, batch costs) are kept under: the model, its
        dtype, the device and whether its weights are packed (packing changes speed; in float32 also the
        last bits, models/packing.py)."""
        return f"{self.name}|{self.dtype}|{dtypes.device_signature()}" + (
            f"|packed{PACKING_VERSION}" if self.packed else "")

    def encode(self, prompt: PromptLike, *, raw: bool = False) -> list[int]:
        """Token ids for a prompt: a str (a user chat message unless raw), chat messages, or ids. Where the
        tokenizer has no chat template, a str is encoded as it is and messages as `plain_transcript`."""
        if isinstance(prompt, str):
            if not prompt.strip():
                raise PromptError("the prompt is empty; give some text (or '-' to read it from stdin)")
            if raw or not getattr(self.tokenizer, "chat_template", None):
                return list(self.tokenizer(prompt, add_special_tokens=True)["input_ids"])
            prompt = [{"role": "user", "content": prompt}]
        if len(prompt) == 0:
            raise PromptError("the prompt is empty")
        if all(isinstance(t, int) for t in prompt):
            return [int(t) for t in prompt]  # already token ids
        for m in prompt:
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise PromptError('chat messages must be dicts with "role" and "content"')
        if not getattr(self.tokenizer, "chat_template", None):
            return list(self.tokenizer(plain_transcript(prompt), add_special_tokens=True)["input_ids"])
        ids = self.tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(t) for t in ids]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype | None:
    """A torch dtype, or None for "auto" (see models/dtypes.py); a one-line error naming the choices."""
    return dtypes.parse(dtype)


def load(name_or_path: str = "smollm2-135m-instruct", *, dtype: str | torch.dtype | None = "auto",
         probe: bool = True, pack: bool = True) -> LoadedModel:
    """Load an embedded model by name, a Hugging Face model folder, a .gguf file, or `tiny:ARCH`.

    dtype: "auto" (default: the fastest dtype this device runs well, measured once per model and
    device), a dtype name, or a torch dtype. probe: measure the model's width floor now
    (engine/numerics.py) rather than inside the first generate call. pack: run the linear layers on
    weights packed once for the CPU matmul library wherever that costs no exactness (models/packing.py:
    bfloat16 decode passes ~1.4x faster here with the same bits; float32 ~1.35x faster and width-invariant,
    its last bits those of oneDNN rather than MKL; costs a copy of those weights)."""
    requested = parse_dtype(dtype) if dtype is not None else None
    loaded = _load(name_or_path, requested or torch.float32)
    tiny = name_or_path.startswith("tiny:")
    key = f"{loaded.name}|{sum(p.numel() for p in loaded.model.parameters())}"
    if requested is None and not tiny:  # tiny test models stay float32: their timings mean nothing
        chosen = dtypes.choose(loaded.model, key, pack=pack)
        if chosen != loaded.dtype:
            # Loaded again in that dtype, not cast: `model.to(bfloat16)` also rounds the buffers that
            # transformers keeps in float32 (the rotary inv_freq, whose rounding moves every position's
            # angle by up to ~0.2%, so greedy text differs), and "auto" must give the very model that
            # dtype="bfloat16" gives.
            del loaded
            loaded = _load(name_or_path, chosen)
    if pack:
        loaded = replace(loaded, packed=pack_linears(loaded.model))
    if probe:
        from lookahead.engine.numerics import PROBE_VERSION, width_probe

        cache = None if tiny else cache_root() / "width-probes.json"
        # packing can change which widths agree (float32) and the bits (bfloat16 on the tiled kernel)
        packed = f"|packed{PACKING_VERSION}" if loaded.packed else ""
        width_probe(loaded.model, cache_file=cache,
                    cache_key=f"{key}|{loaded.dtype}|{dtypes.device_signature()}{packed}|{PROBE_VERSION}")
    return loaded


def _load(name_or_path: str, torch_dtype: torch.dtype) -> LoadedModel:
    if name_or_path.startswith("tiny:"):  # random-weight test models, built in-process (see lookahead.testing)
        from lookahead.testing import ARCHS, tiny_model

        arch = name_or_path.split(":", 1)[1]
        if arch not in ARCHS:
            raise ModelNotFoundError(f"unknown tiny model {name_or_path!r}; choose tiny:<{'|'.join(ARCHS)}>")
        return tiny_model(arch, dtype=torch_dtype)
    if name_or_path in EMBEDDED:
        gguf = EMBEDDED[name_or_path].gguf_path()
        folder = _converted_folder(gguf)
        return _from_folder(folder, name_or_path, torch_dtype)
    path = Path(name_or_path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return _from_folder(_converted_folder(path), path.stem, torch_dtype)
    if path.is_dir() and (path / "config.json").is_file():
        return _from_folder(path, path.name, torch_dtype)
    known = ", ".join(EMBEDDED)
    raise ModelNotFoundError(
        f"no model at {name_or_path!r}: give one of the embedded names ({known}), "
        "a Hugging Face model folder (with config.json), or a .gguf file"
    )


def _converted_folder(gguf: Path) -> Path:
    """Dequantize a GGUF once into a plain HF folder under the cache (loading GGUF takes ~40 s; a folder ~2 s)."""
    stat = gguf.stat()
    folder = cache_root() / "converted" / f"{gguf.stem}-{stat.st_size}"
    if (folder / "lookahead-source.json").is_file():
        return folder
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    except Exception as exc:  # transformers raises many kinds for a bad file
        raise ModelNotFoundError(f"cannot read GGUF file {gguf}: {type(exc).__name__}: {exc}".splitlines()[0]) from None
    # save_pretrained refuses a model loaded from GGUF; rebuild a plain one from its config and weights.
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    plain.generation_config = model.generation_config
    folder.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(folder)
    tok.save_pretrained(folder)
    (folder / "lookahead-source.json").write_text(json.dumps({"gguf": str(gguf), "size": stat.st_size}))
    return folder


def _from_folder(folder: Path, name: str, dtype: torch.dtype) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype)
    except Exception as exc:
        raise ModelNotFoundError(f"cannot load model from {folder}: {type(exc).__name__}: {exc}".splitlines()[0]) from None
    return wrap(model, tokenizer, name=name)


def wrap(model: Any, tokenizer: Any, *, name: str) -> LoadedModel:
    """Wrap an already-loaded HF model and tokenizer (e.g. built in a test) for the engine."""
    model.eval()
    return LoadedModel(
        name=name,
        model=model,
        tokenizer=tokenizer,
        eos_token_ids=_eos_ids(model, tokenizer),
        context_length=_context_length(model.config),
        dtype=next(model.parameters()).dtype,
    )


def _eos_ids(model: Any, tokenizer: Any) -> tuple[int, ...]:
    ids: list[int] = []
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, int) and v >= 0 and v not in ids:
                ids.append(v)
    return tuple(ids)


def _context_length(config: Any) -> int:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for attr in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(text, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return 2048
